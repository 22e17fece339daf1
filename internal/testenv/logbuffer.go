package testenv

import (
	"bytes"
	"log/slog"
	"sync"
)

// LogBuffer collects what many goroutines write (a service's logger, a
// child process's output) for a test to read; safe for concurrent use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Logger returns a JSON logger that writes to l.
func (l *LogBuffer) Logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }
