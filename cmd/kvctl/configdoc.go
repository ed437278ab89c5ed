package main

import (
	"flag"
	"io"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// configDoc prints the configuration reference generated from the Go
// model (make docs writes it to docs/configuration.md).
func configDoc(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config-doc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "the source checkout (field descriptions are read from its Go files)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	doc, err := kvcrouter.ConfigReference(*root)
	if err != nil {
		return err
	}
	_, err = stdout.Write(doc)
	return err
}
