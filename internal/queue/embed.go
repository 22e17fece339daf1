package queue

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/records"
)

// EmbeddedConfig configures the in-process nats-server of the default setup.
type EmbeddedConfig struct {
	// DataDir holds JetStream's file storage.
	DataDir string
	// Listen is the client address ("127.0.0.1:4222"); empty opens no port,
	// and only this process can reach the server.
	Listen string
	// MaxPayload is the largest message the server takes (0: 1 MiB + HeaderRoom).
	MaxPayload int32
	// User and Password, when set, are the throttler's own user; the server
	// then takes no connection without credentials.
	User, Password string
	// Publishers are outside users allowed to publish jobs on the public
	// subjects of their lanes only (PublisherPermissions).
	Publishers []EmbeddedPublisher
	// Workers are outside workers of pull-mode lanes (WorkerPermissions).
	Workers []EmbeddedWorker
	// Pull, when set, is the user of the connection that talks to
	// pull-mode workers (PullPermissions); it needs User.
	Pull   *EmbeddedPull
	Logger *slog.Logger
}

// EmbeddedPull is the pull user of the embedded server: the throttler's
// connection to its pull-mode workers logs in as it.
type EmbeddedPull struct {
	User, Password string
	// Workers are the worker users whose inboxes it may publish to; none
	// allows every _INBOX.<user>. inbox.
	Workers []string
	// Subjects are the pull-mode lanes' work subjects.
	Subjects []string
}

// PullPermissions are the NATS permissions of the connection that talks
// to pull-mode workers, and all it gets: publish to the inboxes of
// workers (_INBOX.<worker>.>; every _INBOX.> inbox when no worker user is
// named) and subscribe to the work subjects S (pull requests) and their
// outcome subjects S.ack.>. Whatever reply subject a worker names, this
// user cannot publish on the JetStream API, the throttler's own subjects,
// a lane's intake or the throttler's inbox (ThrottlerInbox).
// docs/OPERATIONS.md gives the same permissions for an external server.
func PullPermissions(workers, subjects []string) *server.Permissions {
	publish := []string{"_INBOX.>"}
	if len(workers) > 0 {
		publish = nil
		for _, w := range workers {
			publish = append(publish, UserInbox(w)+".>")
		}
	}
	var subscribe []string
	for _, s := range subjects {
		subscribe = append(subscribe, s, s+".ack.>")
	}
	if len(subscribe) == 0 {
		// An empty allow list allows everything: deny instead.
		return &server.Permissions{Publish: &server.SubjectPermission{Allow: publish},
			Subscribe: &server.SubjectPermission{Deny: []string{">"}}}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: publish},
		Subscribe: &server.SubjectPermission{Allow: subscribe},
	}
}

// ThrottlerInbox is the inbox prefix of the throttler's own connections
// (nats.CustomInboxPrefix): JetStream API replies, deliveries and its
// requests to NATS targets come back on ThrottlerInbox.>, a subject space
// that no publisher, worker or pull user may subscribe to (their inboxes
// are _INBOX.<user>.>).
const ThrottlerInbox = "_INBOX_throttler"

// EmbeddedWorker is an outside worker of the embedded server.
type EmbeddedWorker struct {
	User, Password string
	// Publish are the subjects it may publish to: its lanes' work
	// subjects and their outcome subjects.
	Publish []string
}

// WorkerPermissions are the NATS permissions a pull-mode worker needs, and
// all it gets: publish on publish (its lanes' work subjects S and S.ack.>)
// and subscribe to its own inbox prefix _INBOX.<user>.>, so that it never
// sees the jobs, nor the outcome subjects, handed to another worker.
// docs/WORKERS.md gives the same permissions for an external server.
func WorkerPermissions(user string, publish []string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: publish},
		Subscribe: &server.SubjectPermission{Allow: []string{UserInbox(user) + ".>"}},
	}
}

// UserInbox is the inbox prefix of a publisher or worker user: its
// connection sets it (nats.CustomInboxPrefix, the nats CLI's
// --inbox-prefix), and it may subscribe to UserInbox(user).> only.
func UserInbox(user string) string { return "_INBOX." + user }

// EmbeddedPublisher is an outside publisher of the embedded server.
type EmbeddedPublisher struct {
	User, Password string
	// Lanes it may publish to; none means every lane.
	Lanes []string
}

// PublisherPermissions are the NATS permissions an outside publisher of
// jobs needs, and all it gets: publish on the public subjects of lanes
// (throttle.<lane> and throttle.<lane>.<key>; every lane when none are
// given) and receive JetStream's acknowledgements on its own inbox,
// _INBOX.<user>.> (its connection sets that inbox prefix). It cannot
// write the throttler's own subjects (throttler.>, the retry and dead-letter
// streams), call the JetStream API, nor read another client's inbox or the
// throttler's (ThrottlerInbox), where deliveries and API replies travel.
// docs/OPERATIONS.md gives the same permissions for an external server.
//
// It may also read its lanes' results subjects, throttler.results.<lane>.>
// (records.ResultsSubject), where the settled records of the lanes that
// keep them are published: every job's of the lane, not only its own.
func PublisherPermissions(user string, lanes []string) *server.Permissions {
	allow := []string{SubjectPrefix + ".>"}
	sub := []string{UserInbox(user) + ".>", records.ResultsPrefix + ">"}
	if len(lanes) > 0 {
		allow, sub = nil, sub[:1]
		for _, l := range lanes {
			allow = append(allow, Subject(l, ""), Subject(l, ">"))
			sub = append(sub, records.ResultsPrefix+l+".>")
		}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow},
		Subscribe: &server.SubjectPermission{Allow: sub},
	}
}

// StartEmbedded starts an in-process nats-server with JetStream on DataDir and
// waits until it accepts connections. The caller shuts it down.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	opts := &server.Options{
		ServerName: "throttler-embedded",
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: cfg.MaxPayload,
	}
	if opts.MaxPayload == 0 {
		opts.MaxPayload = 1<<20 + HeaderRoom
	}
	if cfg.User != "" {
		opts.Users = append(opts.Users, &server.User{Username: cfg.User, Password: cfg.Password})
		for _, p := range cfg.Publishers {
			opts.Users = append(opts.Users, &server.User{Username: p.User, Password: p.Password, Permissions: PublisherPermissions(p.User, p.Lanes)})
		}
		for _, w := range cfg.Workers {
			opts.Users = append(opts.Users, &server.User{Username: w.User, Password: w.Password, Permissions: WorkerPermissions(w.User, w.Publish)})
		}
		if p := cfg.Pull; p != nil {
			opts.Users = append(opts.Users, &server.User{Username: p.User, Password: p.Password, Permissions: PullPermissions(p.Workers, p.Subjects)})
		}
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("queue: embedded listen %q: %w", cfg.Listen, err)
		}
		opts.Host = host
		if opts.Port, err = strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("queue: embedded listen %q: %w", cfg.Listen, err)
		}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("queue: embedded nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("queue: embedded nats-server in %s did not become ready", cfg.DataDir)
	}
	if cfg.Logger != nil {
		cfg.Logger.Info("embedded nats-server ready", "data_dir", cfg.DataDir, "listen", cfg.Listen,
			"auth", cfg.User != "", "publishers", len(cfg.Publishers), "workers", len(cfg.Workers))
	}
	return srv, nil
}

// ConnectEmbedded connects to an embedded server in-process (no socket).
// The connection's writes go through a buffer (bufferedConn), so that a
// publisher never waits for the server to read the previous flush.
func ConnectEmbedded(srv *server.Server, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(inProcess{srv}), nats.Name("throttler")}, opts...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("queue: connect to embedded nats-server: %w", err)
	}
	return nc, nil
}
