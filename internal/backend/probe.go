package backend

import (
	"context"
	"log/slog"
	"time"

	"github.com/throttler/throttler/internal/metrics"
)

// Check is one backend's health check: it answers nil when the backend
// answered within ctx.
type Check struct {
	// Name is the backend label (metrics.BackendNATS, metrics.BackendRedis).
	Name string
	Ping func(ctx context.Context) error
}

// Probe checks each backend every Every, each check bounded by Timeout, and
// sets throttler_backend_up, throttler_backend_rtt_seconds and
// throttler_backend_probes_total. One probe at a time per backend, so a
// backend that hangs costs at most one goroutine and Timeout per round.
type Probe struct {
	Checks  []Check
	Every   time.Duration // zero: DefaultProbeEvery
	Timeout time.Duration // zero: DefaultProbeTimeout
	Metrics *metrics.Backends
	Logger  *slog.Logger
}

// Defaults of Probe.
const (
	DefaultProbeEvery   = 5 * time.Second
	DefaultProbeTimeout = 2 * time.Second
)

// Run probes at once, then every Every, until ctx ends.
func (p Probe) Run(ctx context.Context) {
	every, timeout := p.Every, p.Timeout
	if every <= 0 {
		every = DefaultProbeEvery
	}
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	up := make([]bool, len(p.Checks))
	for i, c := range p.Checks {
		p.Metrics.InitBackend(c.Name)
		up[i] = true // so that a backend away at start is logged
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for i, c := range p.Checks {
			up[i] = p.once(ctx, c, timeout, up[i])
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// once runs one check and records it; it returns whether it answered.
func (p Probe) once(ctx context.Context, c Check, timeout time.Duration, wasUp bool) bool {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := c.Ping(cctx)
	rtt := time.Since(start)
	if ctx.Err() != nil {
		return wasUp // stopping: the last value stands
	}
	if err != nil {
		p.Metrics.Up.WithLabelValues(c.Name).Set(0)
		p.Metrics.Probes.WithLabelValues(c.Name, "error").Inc()
		if wasUp {
			p.Logger.Warn("backend health probe failed", "backend", c.Name, "err", err)
		}
		return false
	}
	p.Metrics.Up.WithLabelValues(c.Name).Set(1)
	p.Metrics.RTT.WithLabelValues(c.Name).Set(rtt.Seconds())
	p.Metrics.Probes.WithLabelValues(c.Name, "ok").Inc()
	if !wasUp {
		p.Logger.Info("backend health probe answers again", "backend", c.Name, "rtt", rtt.String())
	}
	return true
}
