package main

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/kvc-router/kvc-router/testbed/bench"
)

var palette = []color.RGBA{
	{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255}, {148, 103, 189, 255},
	{140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}, {188, 189, 34, 255}, {23, 190, 207, 255},
	{0, 0, 0, 255}, {255, 215, 0, 255},
}

// writePlot draws three panels side by side: hit rate by policy (with the
// oracle bound and the pooled-LRU reference as lines), the TTFT CDF (log time axis), and
// the summed rollout-step makespan (or the trace span for mooncake).
func writePlot(path string, rep *bench.Report, results map[string]*bench.Result) error {
	names := rep.Order
	hit, err := barPlot(names, func(n string) float64 { return 100 * rep.Policies[n].HitRate },
		fmt.Sprintf("%s: prefix hit rate", rep.Workload), "token hit rate (%)")
	if err != nil {
		return err
	}
	for _, b := range []struct {
		label string
		v     float64
		c     color.RGBA
	}{{"oracle", rep.Bounds.Oracle, color.RGBA{200, 0, 0, 255}}, {"pooled LRU (reference)", rep.Bounds.Pooled, color.RGBA{0, 0, 200, 255}}} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 100 * b.v}, {X: float64(len(names)) - 0.5, Y: 100 * b.v}})
		if err != nil {
			return err
		}
		l.Color = b.c
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		hit.Add(l)
		hit.Legend.Add(b.label, l)
	}
	hit.Legend.Top = true
	hit.Legend.Left = true
	top := 100 * math.Max(rep.Bounds.Oracle, rep.Bounds.Pooled)
	for _, n := range names {
		top = math.Max(top, 100*rep.Policies[n].HitRate)
	}
	hit.Y.Max = math.Min(100, top*1.25) + 1

	cdf := plot.New()
	cdf.Title.Text = "TTFT CDF"
	cdf.X.Label.Text = "TTFT (s, log scale)"
	cdf.Y.Label.Text = "fraction of requests"
	cdf.X.Scale = plot.LogScale{}
	cdf.X.Tick.Marker = plot.LogTicks{Prec: -1}
	cdf.Legend.Top = false
	cdf.Legend.Left = false
	cdf.Legend.XOffs = 0
	cdf.Add(plotter.NewGrid())
	for i, n := range names {
		r := results[n]
		if r == nil || len(r.TTFT) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, 200)
		step := max(1, len(r.TTFT)/200)
		for k := 0; k < len(r.TTFT); k += step {
			pts = append(pts, plotter.XY{X: math.Max(r.TTFT[k], 1e-3), Y: float64(k+1) / float64(len(r.TTFT))})
		}
		pts = append(pts, plotter.XY{X: math.Max(r.TTFT[len(r.TTFT)-1], 1e-3), Y: 1})
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		cdf.Add(l)
		cdf.Legend.Add(n, l)
	}

	spanTitle := "rollout makespan (sum over steps)"
	if rep.Workload == "mooncake" {
		spanTitle = "trace makespan (first arrival to last completion)"
	}
	ms, err := barPlot(names, func(n string) float64 { return rep.Policies[n].Makespan }, spanTitle, "seconds (virtual)")
	if err != nil {
		return err
	}

	const w, h = 18 * vg.Inch, 6 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 4, PadLeft: vg.Millimeter * 3,
		PadRight: vg.Millimeter * 3, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3}
	plots := [][]*plot.Plot{{hit, cdf, ms}}
	canvases := plot.Align(plots, tiles, dc)
	for j, p := range plots[0] {
		p.Draw(canvases[0][j])
	}
	return savePNG(path, img)
}

func barPlot(names []string, val func(string) float64, title, ylabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	for i, n := range names {
		vals := make(plotter.Values, len(names))
		vals[i] = val(n)
		b, err := plotter.NewBarChart(vals, vg.Points(22))
		if err != nil {
			return nil, err
		}
		b.Color = palette[i%len(palette)]
		b.LineStyle.Width = 0
		p.Add(b)
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: float64(i), Y: val(n)}}, Labels: []string{fmtVal(val(n))}})
		if err == nil {
			lbl.Offset = vg.Point{X: -vg.Points(8), Y: vg.Points(3)}
			for k := range lbl.TextStyle {
				lbl.TextStyle[k].Font.Size = vg.Points(8)
			}
			p.Add(lbl)
		}
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 5
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	p.Y.Min = 0
	return p, nil
}

func fmtVal(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
