package backend

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/config"
)

// Redis is a client of the configured Redis and the auto-pipeliner that
// concurrent admissions and reservations share (one round trip for many
// calls, docs/BENCHMARKS.md). Close it once.
type Redis struct {
	Client redis.UniversalClient
	Pipe   *redis.AutoPipeliner
	url    string
	stop   func()
}

// OpenRedis makes the client of the redis section. A Redis that does not
// answer at start is logged, not refused: admission queues and drains wait
// until it answers. On Redis Cluster the slot map is reloaded every
// ClusterReloadEvery until Close.
func OpenRedis(ctx context.Context, c config.Redis, log *slog.Logger) (*Redis, error) {
	opt, err := RedisOptions(c)
	if err != nil {
		return nil, err
	}
	client := redis.NewUniversalClient(opt)
	pipe, err := client.AutoPipeline()
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		log.Warn("redis unreachable at start; admission queues and drains wait until it answers", "err", Scrub(err, c.URL))
	}
	r := &Redis{Client: client, Pipe: pipe, url: c.URL, stop: func() {}}
	if cc, ok := client.(*redis.ClusterClient); ok {
		r.stop = reloadClusterState(cc, ClusterReloadEvery)
	}
	return r, nil
}

// Scrub hides the secrets of redis.url in err's message.
func (r *Redis) Scrub(err error) error { return Scrub(err, r.url) }

// Close stops the slot map reloads and closes the pipeliner and the client.
func (r *Redis) Close() {
	r.stop()
	_ = r.Pipe.Close()
	_ = r.Client.Close()
}

// ClusterReloadEvery is how often a Redis Cluster client reloads the slot
// map: go-redis reloads it on MOVED replies, not when the master of a slot
// dies, and so kept dialing a dead master for tens of seconds after its
// replica took over (internal/fleet TestRedisClusterHundredLanes). One
// CLUSTER SLOTS a second per instance is cheap.
const ClusterReloadEvery = time.Second

// reloadClusterState reloads cc's slot map every period until stop is
// called.
func reloadClusterState(cc *redis.ClusterClient, period time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				cc.ReloadState(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// RedisOptions reads redis.url in the form of redis.mode (single, sentinel
// or cluster) and makes one set of client options for every kind. Every
// kind fails fast while Redis is away: one dial attempt, no command
// retries, deadlines honoured, so the drain pauses and admission queues at
// once. A URL that does not parse is a *config.Error on redis.url whose
// message holds none of the URL's secrets.
func RedisOptions(cfg config.Redis) (*redis.UniversalOptions, error) {
	bad := func(err error) error {
		return &config.Error{Field: "redis.url", Msg: config.ScrubURL(err.Error(), cfg.URL)}
	}
	var u redis.UniversalOptions
	switch cfg.Mode {
	case "cluster":
		o, err := redis.ParseClusterURL(cfg.URL)
		if err != nil {
			return nil, bad(err)
		}
		u = redis.UniversalOptions{Addrs: o.Addrs, IsClusterMode: true, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig}
	case "sentinel":
		o, err := redis.ParseFailoverURL(cfg.URL)
		if err != nil {
			return nil, bad(err)
		}
		u = redis.UniversalOptions{Addrs: o.SentinelAddrs, MasterName: o.MasterName, DB: o.DB, Username: o.Username, Password: o.Password,
			SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword, TLSConfig: o.TLSConfig}
	default:
		o, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, bad(err)
		}
		u = redis.UniversalOptions{Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig}
	}
	u.ContextTimeoutEnabled, u.DialerRetries, u.MaxRetries, u.DialTimeout = true, 1, -1, 500*time.Millisecond
	return &u, nil
}

// Scrub hides the secrets of rawURL in err's message, keeping err for
// errors.Is and errors.As.
func Scrub(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	return scrubbedError{msg: config.ScrubURL(err.Error(), rawURL), err: err}
}

type scrubbedError struct {
	msg string
	err error
}

func (e scrubbedError) Error() string { return e.msg }
func (e scrubbedError) Unwrap() error { return e.err }
