// Package backend opens the servers the throttler stands on, from their
// config sections: NATS (an external server, or a nats-server embedded in
// the process with JetStream) and Redis (one node, Sentinel or Cluster,
// through one redis.UniversalOptions). It starts nothing but those
// connections, and every error that a setting causes names its field.
package backend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	// Pull talks to pull-mode workers: a connection whose user may publish
	// to workers' inboxes only (the embedded server's pull user, or
	// nats.pull_login); Conn itself when there is none.
	Pull *nats.Conn
	srv  *server.Server // the embedded server; nil for nats.url
	url  string
}

// OpenNATS connects to nats.url, or, when it is empty, starts the embedded
// server on nats.data_dir (sized for the largest max_body of lanes, with
// the publisher and worker users of the nats section) and connects to it
// in-process. The connection reconnects for ever and logs its drops. Its
// inbox prefix is queue.ThrottlerInbox, which no outside user may read.
// When the embedded server has users, it also creates the pull user with a
// fresh password (queue.PullPermissions) and connects NATS.Pull as it; on
// nats.url, NATS.Pull logs in with nats.pull_login.
func OpenNATS(n config.NATS, lanes []config.Lane, log *slog.Logger) (*NATS, error) {
	opts := []nats.Option{
		nats.Name("throttler"),
		nats.CustomInboxPrefix(queue.ThrottlerInbox),
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
	common := slices.Clip(opts) // without a login: the pull connection's too
	if n.User != "" {
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	workers, subjects := pullWorkers(n, lanes)
	if len(subjects) > 0 && workers == nil && (n.URL != "" || n.User != "") {
		log.Warn("a pull-mode lane names no worker users: it answers a pull request on any _INBOX.<user>. inbox",
			"fix", "list the workers in nats.workers (docs/WORKERS.md)")
	}
	if n.URL != "" {
		tlsOpts := tlsOptions(n.TLS)
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
		opts = append(opts, tlsOpts...)
		nc, err := nats.Connect(n.URL, append(opts, nats.RetryOnFailedConnect(false))...)
		if err != nil {
			return nil, Scrub(fmt.Errorf("nats.url %s: %w", config.RedactURL(n.URL), err), n.URL)
		}
		nb := &NATS{Conn: nc, Pull: nc, url: n.URL}
		if !n.PullLogin.Set() {
			if len(subjects) > 0 {
				log.Warn("pull-mode workers are answered with the throttler's own NATS user",
					"fix", "set nats.pull_login to a user that may publish to the workers' inboxes only (docs/OPERATIONS.md)")
			}
			return nb, nil
		}
		login, err := loginOptions(n.PullLogin)
		if err != nil {
			nc.Close()
			return nil, err
		}
		pc, err := nats.Connect(n.URL, slices.Concat(common, []nats.Option{nats.Name("throttler-pull")}, login, tlsOpts,
			[]nats.Option{nats.RetryOnFailedConnect(false)})...)
		if err != nil {
			nc.Close()
			return nil, Scrub(fmt.Errorf("nats.pull_login: nats.url %s: %w", config.RedactURL(n.URL), err), n.URL)
		}
		nb.Pull = pc
		return nb, nil
	}
	var pubs []queue.EmbeddedPublisher
	for _, p := range n.Publishers {
		pubs = append(pubs, queue.EmbeddedPublisher{User: p.User, Password: p.Password, Lanes: p.Lanes})
	}
	var pull *queue.EmbeddedPull
	if n.User != "" {
		// A fresh password at every start: only this process logs in as it.
		pull = &queue.EmbeddedPull{User: config.EmbeddedPullUser, Password: randomPassword(), Workers: workers, Subjects: subjects}
	}
	srv, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: n.DataDir, Listen: n.Listen,
		MaxPayload: MaxMessage(lanes), User: n.User, Password: n.Password, Publishers: pubs, Workers: EmbeddedWorkers(n.Workers, lanes),
		Pull: pull, Logger: log.With("component", "nats")})
	if err != nil {
		return nil, err
	}
	nc, err := queue.ConnectEmbedded(srv, opts...)
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	nb := &NATS{Conn: nc, Pull: nc, srv: srv}
	if pull != nil {
		pc, err := queue.ConnectEmbedded(srv, append(common, nats.Name("throttler-pull"), nats.UserInfo(pull.User, pull.Password))...)
		if err != nil {
			nc.Close()
			srv.Shutdown()
			return nil, err
		}
		nb.Pull = pc
	}
	if c := (config.Config{NATS: n, Lanes: lanes}); c.EmbeddedMemory() > config.EmbeddedMemoryWarn {
		// The store is in this process: a burst that fills the lanes'
		// bounds takes this much, mostly JetStream's de-duplication index.
		log.Warn("embedded nats: the lanes' bounds allow more memory than a small instance expects",
			"estimate_mb", c.EmbeddedMemory()/1_000_000, "warn_mb", config.EmbeddedMemoryWarn/1_000_000,
			"dedup_ids", c.DedupIDs(), "dedup_window", n.DedupWindow.D().String(),
			"fix", "shorten nats.dedup_window, lower lanes[].max_backlog, or set nats.url (docs/OPERATIONS.md, Memory of the embedded server)")
	}
	return nb, nil
}

// pullWorkers returns the work subjects of the pull-mode lanes, and the
// worker users of all of them; nil workers when one of them names none
// (its inbox check takes any user's).
func pullWorkers(n config.NATS, lanes []config.Lane) (workers, subjects []string) {
	open := false
	for _, l := range lanes {
		if !l.Target.Pull() {
			continue
		}
		subjects = append(subjects, l.Target.NATS.Subject)
		ws := n.WorkersOf(l.Name)
		if len(ws) == 0 {
			open = true
		}
		for _, w := range ws {
			if !slices.Contains(workers, w) {
				workers = append(workers, w)
			}
		}
	}
	if open {
		workers = nil
	}
	return workers, subjects
}

// PullWorkers are the worker users of each pull-mode lane by name, for
// the lanes' reply checks (lane.Deps.Workers).
func PullWorkers(n config.NATS, lanes []config.Lane) map[string][]string {
	out := map[string][]string{}
	for _, l := range lanes {
		if l.Target.Pull() {
			out[l.Name] = n.WorkersOf(l.Name)
		}
	}
	return out
}

// tlsOptions are nats.tls's options.
func tlsOptions(t config.NATSTLS) []nats.Option {
	var opts []nats.Option
	if t.CAFile != "" {
		opts = append(opts, nats.RootCAs(t.CAFile))
	}
	if t.CertFile != "" {
		opts = append(opts, nats.ClientCert(t.CertFile, t.KeyFile))
	}
	return opts
}

// loginOptions are nats.pull_login's options.
func loginOptions(l config.NATSLogin) ([]nats.Option, error) {
	switch {
	case l.User != "":
		return []nats.Option{nats.UserInfo(l.User, l.Password)}, nil
	case l.CredsFile != "":
		return []nats.Option{nats.UserCredentials(l.CredsFile)}, nil
	case l.NkeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(l.NkeySeedFile)
		if err != nil {
			return nil, &config.Error{Field: "nats.pull_login.nkey_seed_file", Msg: err.Error()}
		}
		return []nats.Option{o}, nil
	}
	return nil, nil
}

// randomPassword is 32 random bytes in hex.
func randomPassword() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
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

// Close drains the connections, then stops the embedded server if any.
func (n *NATS) Close() {
	if n.Pull != nil && n.Pull != n.Conn {
		_ = n.Pull.Drain()
		for st := n.Pull.Status(); st == nats.DRAINING_SUBS || st == nats.DRAINING_PUBS; st = n.Pull.Status() {
			time.Sleep(5 * time.Millisecond)
		}
		n.Pull.Close()
	}
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
			if !l.Target.Pull() || !w.Serves(l.Name) {
				continue
			}
			publish = append(publish, l.Target.NATS.Subject, dispatch.AckPrefix(l.Target.NATS.Subject)+".>")
		}
		out = append(out, queue.EmbeddedWorker{User: w.User, Password: w.Password, Publish: publish})
	}
	return out
}
