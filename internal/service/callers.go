package service

import (
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/redisquota"
)

// lanesFold is the lane store the caller quotas fold a single job's lane
// peek into (one round trip for the caller check and the lane's decision):
// the Redis store, unless Redis is a cluster, where the lanes' keys and the
// {callers} keys sit on different slots and no script may touch both; nil
// then, and the lane is peeked in a call of its own.
func lanesFold(store bucket.Store, mode string) redisquota.Lanes {
	if rs, ok := store.(*redisbucket.Store); ok && mode != "cluster" {
		return rs
	}
	return nil
}

// callers builds the caller quotas of the API, or nil without a callers
// section: with Redis, the fleet's shared state, falling back to this
// instance's memory while Redis is away (logged, counted); else memory.
// lanes, when set, reads a single job's lane state in the caller check's
// script.
func (s *Service) callers(rc *redis.AutoPipeliner, lanes redisquota.Lanes, m *metrics.Metrics, laneNames []string) *ingest.Callers {
	c := s.cfg.Callers
	if c == nil {
		s.log.Info("caller quotas off: the config has no callers section")
		return nil
	}
	var lim quota.Limiter = &quota.Memory{}
	if rc != nil {
		log := s.log.With("component", "callers")
		var mu sync.Mutex
		var last time.Time
		var missed int
		lim = &quota.Failover{
			Primary: redisquota.New(rc, redisquota.Config{Lanes: lanes}),
			Local:   lim,
			OnFallback: func(err error) {
				m.Callers.Fallbacks.Inc()
				mu.Lock()
				defer mu.Unlock()
				missed++
				if now := time.Now(); now.Sub(last) >= 10*time.Second {
					log.Warn("redis unavailable: caller quotas are enforced per instance from memory (fail open per instance)",
						"checks_since_last_log", missed, "err", scrubbed(err, s.cfg.Redis.URL))
					last, missed = now, 0
				}
			},
		}
	}
	p := callerPolicy(c)
	s.log.Info("caller quotas on", "per_ip", p.PerIP.Limit, "window", p.PerIP.Length.String(), "plans", len(p.Plans),
		"anonymous_plan", p.AnonymousPlan, "trusted_proxies", len(p.TrustedProxies), "shared", rc != nil, "lane_in_same_script", lanes != nil)
	return &ingest.Callers{Limiter: lim, Lanes: laneNames, Policy: p}
}

// callerPolicy turns a validated callers section into the API's policy.
func callerPolicy(c *config.Callers) ingest.CallerPolicy {
	p := ingest.CallerPolicy{
		PerIP: c.PerIP.Quota(), ObserveIP: c.PerIP.Observe, TrustedProxies: c.TrustedPrefixes(),
		Plans: map[string]ingest.Plan{}, AnonymousPlan: c.AnonymousPlan, DefaultPlan: c.DefaultPlan,
	}
	for name, pl := range c.Plans {
		p.Plans[name] = ingest.Plan{Rate: pl.Rate, Burst: pl.Burst, Observe: pl.Observe}
	}
	return p
}

func names(lanes []config.Lane) []string {
	out := make([]string, 0, len(lanes))
	for _, l := range lanes {
		out = append(out, l.Name)
	}
	return out
}

// reloadCallers applies the callers section of a config read again.
func reloadCallers(log *slog.Logger, api *ingest.Handler, old, next *config.Callers) error {
	switch {
	case old == nil && next == nil:
		return nil
	case old == nil || next == nil:
		log.Warn("reload: turning caller quotas on or off needs a restart; the callers section is ignored")
		return nil
	}
	if err := api.SetCallers(callerPolicy(next)); err != nil {
		return err
	}
	log.Info("reload: caller quotas replaced", "plans", len(next.Plans), "per_ip", next.PerIP.Limit)
	return nil
}
