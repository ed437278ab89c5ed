package server

import (
	"sync"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// Shutting a server down while callers are inside Do (the /metrics,
// /sim/requests and flush paths) must not let the engine loop run a
// command after Do has returned: callers read what the command wrote.
// Under -race the old Do, which returned on quit while the loop could
// still run the command, was reported here (and in the collector's
// end-to-end test, by a scrape racing the test's Close).
func TestDoDuringShutdown(t *testing.T) {
	for i := 0; i < 30; i++ {
		s, err := New(Config{Engine: sim.Config{NumGPUBlocks: 16, ModelName: "test/model"}, Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 100000; k++ { // bounded; ends at the first errStopped
					var blocks int
					err := s.Do(0, func(e *sim.Engine) { blocks = e.Config().NumGPUBlocks })
					if err != nil {
						if blocks != 0 && blocks != 16 {
							t.Errorf("blocks %d", blocks)
						}
						return
					}
					if blocks != 16 {
						t.Errorf("Do returned nil before running f: blocks %d", blocks)
						return
					}
				}
			}()
		}
		time.Sleep(time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	}
}
