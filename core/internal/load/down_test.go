package load

import (
	"errors"
	"testing"
)

func TestDownIsImmediate(t *testing.T) {
	s := New(Config{UnhealthyAfter: 3})
	s.Add("a")
	if !s.Down("a", errors.New("connection refused")) {
		t.Fatal("first Down must turn the server unhealthy")
	}
	if sn, _ := s.Get("a"); sn.Healthy || sn.Failures != 1 || sn.LastError != "connection refused" {
		t.Fatalf("%+v", sn)
	}
	if s.Down("a", nil) || s.Fail("a", nil) {
		t.Fatal("already unhealthy: no second transition")
	}
	s.Update("a", Metrics{})
	if sn, _ := s.Get("a"); !sn.Healthy || sn.Failures != 0 {
		t.Fatalf("a successful scrape must heal: %+v", sn)
	}
	if s.Down("zz", nil) {
		t.Fatal("unknown server")
	}
}
