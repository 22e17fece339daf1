package config

import (
	"time"

	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
)

// applyDefaults fills an enabled block's unset fields.
func (a *Adaptive) applyDefaults() {
	if !a.Enabled {
		return
	}
	if a.Decrease == 0 {
		a.Decrease = 0.5
	}
	if a.Increase == 0 {
		a.Increase = 0.05
	}
	if a.Min == 0 {
		a.Min = 0.1
	}
	if a.Interval == 0 {
		a.Interval = Duration(5 * time.Second)
	}
}

// Default returns the settings used for everything a file leaves out.
func Default() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		ShutdownTimeout: Duration(15 * time.Second),
		NATS:            NATS{DataDir: "./data", DedupWindow: Duration(2 * time.Minute), Replicas: 1},
		DeadLetters:     DeadLetters{MaxAge: Duration(14 * 24 * time.Hour), MaxBytes: 1 << 30},
		Retries:         Retries{MaxMessages: 1_000_000, MaxBytes: 1 << 30},
		Log:             Log{Level: "info"},
		HTTP:            DefaultHTTP(),
	}
}

// Lane defaults, applied to each lane that leaves a field out.
const (
	DefaultMaxInflight = 16
	DefaultMaxBacklog  = 100_000
	DefaultMaxBody     = 1 << 20
	DefaultTimeout     = 10 * time.Second
	DefaultMaxBytes    = 1 << 30
	DefaultMaxAttempts = 10
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
	// DefaultAdmitWait: the drain usually gives a job of an idle lane its
	// slot within a millisecond; this bounds a loaded machine's wait.
	DefaultAdmitWait = 100 * time.Millisecond
	// DefaultAckWait bounds how long the jobs a crashed instance held stay
	// invisible to the others; live instances keep their jobs alive.
	DefaultAckWait = 5 * time.Second
)

// ApplyDefaults fills every lane field left at zero with its default; Load
// does it, code that builds a Config by hand calls it before Validate.
func (c *Config) ApplyDefaults() {
	for i := range c.Lanes {
		c.Lanes[i].applyDefaults()
	}
	if c.Callers != nil {
		c.Callers.applyDefaults()
	}
}

func (l *Lane) applyDefaults() {
	if l.MaxInflight == 0 {
		l.MaxInflight = DefaultMaxInflight
	}
	if l.MaxBacklog == 0 {
		l.MaxBacklog = DefaultMaxBacklog
	}
	if l.MaxBody == 0 {
		l.MaxBody = DefaultMaxBody
	}
	if q := l.Quota; q != nil {
		if q.Burst == 0 {
			q.Burst = 1
		}
		// Derived only when rate and burst are left out; Validate refuses
		// a lane that gives both.
		if r, err := q.rate(); err == nil && l.Rate.IsZero() && l.Burst == 0 {
			l.Rate, l.Burst = r, q.Burst
		}
	}
	if l.Burst == 0 {
		l.Burst = 1
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.AckWait == 0 {
		l.AckWait = Duration(DefaultAckWait)
	}
	if k := l.PerKey; k != nil {
		if k.Burst == 0 {
			k.Burst = 1
		}
		if k.MaxInflight == 0 {
			k.MaxInflight = l.MaxInflight
		}
		if k.Ordered {
			k.MaxInflight = 1
		}
	}
	if l.AdmitWait == 0 {
		l.AdmitWait = Duration(DefaultAdmitWait)
	}
	if l.MaxDelay == 0 {
		l.MaxDelay = Duration(queue.DefaultMaxDelay)
	}
	if l.Cost == 0 {
		l.Cost = 1
	}
	if l.Results != nil {
		l.Results.applyDefaults()
	}
	if l.Retry.MaxAttempts == 0 {
		l.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if l.Retry.BackoffBase == 0 {
		l.Retry.BackoffBase = Duration(DefaultBackoffBase)
	}
	if l.Retry.BackoffMax == 0 {
		l.Retry.BackoffMax = Duration(DefaultBackoffMax)
	}
	l.Adaptive.applyDefaults()
	if k := l.PerKey; k != nil {
		k.Adaptive.applyDefaults()
	}
	if n := l.Target.NATS; n != nil {
		if n.Timeout == 0 {
			n.Timeout = Duration(DefaultTimeout)
		}
		if n.Mode == "" {
			n.Mode = NATSModeRequest
		}
		if n.Mode == NATSModePull && n.Lease == 0 {
			n.Lease = Duration(dispatch.DefaultLease)
		}
	}
	if h := l.Target.HTTP; h != nil {
		if h.Method == "" {
			h.Method = "POST"
		}
		if h.Timeout == 0 {
			h.Timeout = Duration(DefaultTimeout)
		}
	}
}
