// Package sink is a tiny HTTP target that logs every job it receives with
// the gap since the previous one and a per-second count, so that a newcomer
// can watch a burst turn into a steady stream. It is a demo and test tool,
// not part of the delivery path.
package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Config configures a sink.
type Config struct {
	Listen string
	// Status is the answer to every request (200 unless set).
	Status int
	Logger *slog.Logger
}

// Sink counts and logs arrivals. Safe for concurrent use.
type Sink struct {
	cfg   Config
	mu    sync.Mutex
	last  time.Time
	total int
	sec   time.Time
	inSec int
}

// New returns a sink handler.
func New(cfg Config) *Sink {
	if cfg.Status == 0 {
		cfg.Status = http.StatusOK
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sink{cfg: cfg}
}

// ServeHTTP implements http.Handler.
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	now := time.Now()
	s.mu.Lock()
	s.total++
	gap := time.Duration(0)
	if !s.last.IsZero() {
		gap = now.Sub(s.last)
	}
	s.last = now
	sec := now.Truncate(time.Second)
	if !sec.Equal(s.sec) {
		if s.inSec > 0 {
			s.cfg.Logger.Info("second done", "second", s.sec.Format("15:04:05"), "jobs", s.inSec)
		}
		s.sec, s.inSec = sec, 0
	}
	s.inSec++
	total := s.total
	s.mu.Unlock()
	s.cfg.Logger.Info("job received", "n", total, "id", r.Header.Get("Idempotency-Key"), "method", r.Method, "path", r.URL.Path,
		"bytes", n, "gap_ms", fmt.Sprintf("%.1f", float64(gap)/float64(time.Millisecond)))
	w.WriteHeader(s.cfg.Status)
}

// Run serves a sink on cfg.Listen until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	s := New(cfg)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	s.cfg.Logger.Info("sink listening", "addr", ln.Addr().String(), "status", s.cfg.Status)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
