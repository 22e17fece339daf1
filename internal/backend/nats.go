// Package backend opens the servers the throttler stands on, from their
// config sections: NATS (an external server, or a nats-server embedded in
// the process with JetStream) and Redis (one node, Sentinel or Cluster,
// through one redis.UniversalOptions). It starts nothing but those
// connections, and every error that a setting causes names its field.
package backend

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
)

// NATS is a connection to the configured NATS: the external server of
// nats.url, or the embedded one it started. Close it once.
type NATS struct {
	Conn *nats.Conn
	srv  *server.Server // the embedded server; nil for nats.url
	url  string
}

// OpenNATS connects to nats.url, or, when it is empty, starts the embedded
// server on nats.data_dir (sized for the largest max_body of lanes, with
// the publisher and worker users of the nats section) and connects to it
// in-process. The connection reconnects for ever and logs its drops.
func OpenNATS(n config.NATS, lanes []config.Lane, log *slog.Logger) (*NATS, error) {
	opts := []nats.Option{
		nats.Name("throttler"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if err == nil || c.IsClosed() || c.IsDraining() {
				return // our own close at shutdown
			}
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
	}
	if n.User != "" {
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	if n.URL != "" {
		if n.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(n.CredsFile))
		}
		if n.NkeySeedFile != "" {
			o, err := nats.NkeyOptionFromSeed(n.NkeySeedFile)
			if err != nil {
				return nil, &config.Error{Field: "nats.nkey_seed_file", Msg: err.Error()}
			}
			opts = append(opts, o)
		}
		if n.TLS.CAFile != "" {
			opts = append(opts, nats.RootCAs(n.TLS.CAFile))
		}
		if n.TLS.CertFile != "" {
			opts = append(opts, nats.ClientCert(n.TLS.CertFile, n.TLS.KeyFile))
		}
		nc, err := nats.Connect(n.URL, append(opts, nats.RetryOnFailedConnect(false))...)
		if err != nil {
			return nil, Scrub(fmt.Errorf("nats.url %s: %w", config.RedactURL(n.URL), err), n.URL)
		}
		return &NATS{Conn: nc, url: n.URL}, nil
	}
	var pubs []queue.EmbeddedPublisher
	for _, p := range n.Publishers {
		pubs = append(pubs, queue.EmbeddedPublisher{User: p.User, Password: p.Password, Lanes: p.Lanes})
	}
	srv, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: n.DataDir, Listen: n.Listen,
		MaxPayload: MaxMessage(lanes), User: n.User, Password: n.Password, Publishers: pubs, Workers: EmbeddedWorkers(n.Workers, lanes),
		Logger: log.With("component", "nats")})
	if err != nil {
		return nil, err
	}
	nc, err := queue.ConnectEmbedded(srv, opts...)
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	if c := (config.Config{NATS: n, Lanes: lanes}); c.EmbeddedMemory() > config.EmbeddedMemoryWarn {
		// The store is in this process: a burst that fills the lanes'
		// bounds takes this much, mostly JetStream's de-duplication index.
		log.Warn("embedded nats: the lanes' bounds allow more memory than a small instance expects",
			"estimate_mb", c.EmbeddedMemory()/1_000_000, "warn_mb", config.EmbeddedMemoryWarn/1_000_000,
			"dedup_ids", c.DedupIDs(), "dedup_window", n.DedupWindow.D().String(),
			"fix", "shorten nats.dedup_window, lower lanes[].max_backlog, or set nats.url (docs/OPERATIONS.md, Memory of the embedded server)")
	}
	return &NATS{Conn: nc, srv: srv}, nil
}

// Where names the server for a log line: "embedded", or nats.url without
// its secrets.
func (n *NATS) Where() string {
	if n.srv != nil {
		return "embedded"
	}
	return config.RedactURL(n.url)
}

// Embedded is the embedded server, nil for nats.url.
func (n *NATS) Embedded() *server.Server { return n.srv }

// Ready is nil while the connection is up, else says what it is.
func (n *NATS) Ready(context.Context) error {
	if st := n.Conn.Status(); st != nats.CONNECTED {
		return fmt.Errorf("nats connection is %v", st)
	}
	return nil
}

// Close drains the connection, then stops the embedded server if any.
func (n *NATS) Close() {
	_ = n.Conn.Drain()
	for st := n.Conn.Status(); st == nats.DRAINING_SUBS || st == nats.DRAINING_PUBS; st = n.Conn.Status() {
		time.Sleep(5 * time.Millisecond)
	}
	n.Conn.Close()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
}

// MaxMessage is the largest message a lane of lanes can store: the largest
// max_body plus room for the headers.
func MaxMessage(lanes []config.Lane) int32 {
	var m int64
	for _, l := range lanes {
		m = max(m, int64(l.MaxBody))
	}
	return int32(m + queue.HeaderRoom)
}

// FitBodies lowers a lane's max_body in lanes, with a warning, where its
// largest job could not pass a server whose max_payload is maxPayload:
// such a body then gets a 413 that names max_body instead of a 503 from a
// publish that cannot succeed. It returns how many lanes it lowered.
func FitBodies(lanes []config.Lane, maxPayload int64, log *slog.Logger) int {
	limit := config.ByteSize(maxPayload - queue.HeaderRoom)
	lowered := 0
	for i := range lanes {
		if l := &lanes[i]; l.MaxBody > limit {
			log.Warn("max_body lowered to fit the NATS server's max_payload", "lane", l.Name,
				"field", fmt.Sprintf("lanes[%d].max_body", i), "configured", int64(l.MaxBody), "effective", int64(limit), "max_payload", maxPayload)
			l.MaxBody = limit
			lowered++
		}
	}
	return lowered
}

// EmbeddedWorkers are the pull-mode worker users of the embedded server,
// each allowed the work and outcome subjects of its lanes (every pull-mode
// lane when it lists none).
func EmbeddedWorkers(workers []config.Worker, lanes []config.Lane) []queue.EmbeddedWorker {
	var out []queue.EmbeddedWorker
	for _, w := range workers {
		var publish []string
		for _, l := range lanes {
			if !l.Target.Pull() || (len(w.Lanes) > 0 && !slices.Contains(w.Lanes, l.Name)) {
				continue
			}
			publish = append(publish, l.Target.NATS.Subject, dispatch.AckPrefix(l.Target.NATS.Subject)+".>")
		}
		out = append(out, queue.EmbeddedWorker{User: w.User, Password: w.Password, Publish: publish})
	}
	return out
}
