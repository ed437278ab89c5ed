package main

/*
#include <stdint.h>
*/
import "C"

import (
	"io"
	"sync"
	"sync/atomic"
	"syscall"
)

// The process-wide destination of the collectors' log (kvr_set_log_fd):
// nil is stderr, as text; a logFD is a pipe or file the host reads, one JSON
// object per line, so the host can hand each record to its own logging
// (the Python package turns them into logging records of "kvc_router.native").
var (
	logMu   sync.Mutex
	logSink *logFD
)

// logFD writes log lines to a non-blocking descriptor the host owns. A full
// pipe (a host that stopped reading) drops the line and counts it rather
// than stalling a collector goroutine behind the log.
type logFD struct {
	fd      int
	dropped atomic.Uint64
}

func (w *logFD) Write(p []byte) (int, error) {
	for off := 0; off < len(p); {
		n, err := syscall.Write(w.fd, p[off:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			w.dropped.Add(1)
			return len(p), nil
		}
		off += n
	}
	return len(p), nil
}

// logOutput is what a new library logs to: (writer, JSON lines?).
func logOutput() (io.Writer, bool) {
	logMu.Lock()
	defer logMu.Unlock()
	if logSink == nil {
		return nil, false
	}
	return logSink, true
}

//export kvr_set_log_fd
func kvr_set_log_fd(fd C.int32_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_set_log_fd", 0, &code, errOut)
	clearOut(errOut)
	logMu.Lock()
	defer logMu.Unlock()
	if fd < 0 {
		logSink = nil
		return 0
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd), &st); err != nil {
		return fail(errOut, errf(codeInvalidArgument, "log fd %d: %v", int(fd), err))
	}
	if err := syscall.SetNonblock(int(fd), true); err != nil {
		return fail(errOut, errf(codeInvalidArgument, "log fd %d: cannot make it non-blocking: %v", int(fd), err))
	}
	logSink = &logFD{fd: int(fd)}
	return 0
}
