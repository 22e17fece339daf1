package backend_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/backend"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func TestMaxMessage(t *testing.T) {
	t.Parallel()
	if got := backend.MaxMessage(nil); got != queue.HeaderRoom {
		t.Errorf("no lanes: %d, want the header room %d", got, queue.HeaderRoom)
	}
	lanes := []config.Lane{{Name: "a", MaxBody: 1 << 20}, {Name: "b", MaxBody: 4 << 20}, {Name: "c", MaxBody: 10}}
	if got := backend.MaxMessage(lanes); got != 4<<20+queue.HeaderRoom {
		t.Errorf("largest max_body 4 MiB: %d, want %d", got, 4<<20+queue.HeaderRoom)
	}
}

func TestFitBodies(t *testing.T) {
	t.Parallel()
	lanes := []config.Lane{{Name: "small", MaxBody: 1000}, {Name: "big", MaxBody: 8 << 20}, {Name: "edge", MaxBody: 1 << 20}}
	var logs testenv.LogBuffer
	n := backend.FitBodies(lanes, 1<<20+queue.HeaderRoom, logs.Logger())
	if n != 1 {
		t.Fatalf("lowered %d lanes, want 1", n)
	}
	if lanes[0].MaxBody != 1000 || lanes[1].MaxBody != 1<<20 || lanes[2].MaxBody != 1<<20 {
		t.Fatalf("max_body after fitting: %d, %d, %d", lanes[0].MaxBody, lanes[1].MaxBody, lanes[2].MaxBody)
	}
	if l := logs.String(); !strings.Contains(l, `"field":"lanes[1].max_body"`) || !strings.Contains(l, `"configured":8388608`) || strings.Count(l, "\n") != 1 {
		t.Fatalf("want one warning naming lanes[1].max_body:\n%s", l)
	}
}

func TestEmbeddedWorkers(t *testing.T) {
	t.Parallel()
	pull := func(name, subject string) config.Lane {
		return config.Lane{Name: name, Target: config.Target{NATS: &config.NATSTarget{Subject: subject, Mode: config.NATSModePull}}}
	}
	lanes := []config.Lane{
		pull("resize", "work.resize"),
		{Name: "push", Target: config.Target{NATS: &config.NATSTarget{Subject: "work.push"}}},
		pull("mail", "work.mail"),
	}
	got := backend.EmbeddedWorkers([]config.Worker{
		{User: "any", Password: "p1"},
		{User: "mailer", Password: "p2", Lanes: []string{"mail"}},
	}, lanes)
	want := []queue.EmbeddedWorker{
		{User: "any", Password: "p1", Publish: []string{"work.resize", "work.resize.ack.>", "work.mail", "work.mail.ack.>"}},
		{User: "mailer", Password: "p2", Publish: []string{"work.mail", "work.mail.ack.>"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("workers:\n got %+v\nwant %+v", got, want)
	}
	if got := backend.EmbeddedWorkers(nil, lanes); got != nil {
		t.Fatalf("no workers: %+v", got)
	}
}

// TestOpenNATSEmbedded: an empty nats.url starts the embedded server sized
// for the largest max_body, reachable in-process only; Close stops it.
func TestOpenNATSEmbedded(t *testing.T) {
	t.Parallel()
	lanes := []config.Lane{{Name: "demo", MaxBody: 2 << 20}}
	n, err := backend.OpenNATS(config.NATS{DataDir: t.TempDir()}, lanes, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := n.Conn.MaxPayload(), int64(2<<20+queue.HeaderRoom); got != want {
		t.Errorf("max_payload %d, want %d", got, want)
	}
	if n.Where() != "embedded" {
		t.Errorf("Where() = %q", n.Where())
	}
	if err := n.Ready(context.Background()); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if backend.FitBodies(lanes, n.Conn.MaxPayload(), quiet) != 0 {
		t.Error("the embedded server was too small for its lanes")
	}
	if _, err := n.Conn.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Errorf("JetStream on the embedded server: %v", err)
	}
	n.Close()
	if err := n.Ready(context.Background()); err == nil {
		t.Error("Ready after Close")
	}
}

// TestOpenNATSEmbeddedUsers: with nats.user the embedded server takes no
// connection without credentials; a publisher may publish only on its
// lanes' public subjects.
func TestOpenNATSEmbeddedUsers(t *testing.T) {
	t.Parallel()
	listen := testenv.FreeAddr(t)
	cfg := config.NATS{DataDir: t.TempDir(), Listen: listen, User: "throttler", Password: "own-secret",
		Publishers: []config.Publisher{{User: "shop", Password: "shop-secret", Lanes: []string{"demo"}}}}
	n, err := backend.OpenNATS(cfg, []config.Lane{{Name: "demo", MaxBody: 1 << 20}}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := nats.Connect("nats://"+listen, nats.Timeout(2*time.Second)); err == nil {
		t.Fatal("connected without credentials")
	}
	errs := make(chan error, 4)
	shop, err := nats.Connect("nats://"+listen, nats.UserInfo("shop", "shop-secret"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	if err := shop.Publish("throttler.lane.demo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := shop.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("publish on an internal subject: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a publisher wrote the throttler's own subject without a permissions violation")
	}
}

// TestOpenNATSExternal: nats.url connects to that server; Where names it
// without its password.
func TestOpenNATSExternal(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	url := strings.Replace(srv.ClientURL(), "nats://", "nats://user:hunter2@", 1)
	// The test server takes any credentials: no users are configured.
	n, err := backend.OpenNATS(config.NATS{URL: url}, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if w := n.Where(); strings.Contains(w, "hunter2") || !strings.Contains(w, srv.Addr().String()) {
		t.Fatalf("Where() = %q: want the server without the password", w)
	}
	if err := n.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestOpenNATSErrors(t *testing.T) {
	t.Parallel()
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		_, err := backend.OpenNATS(config.NATS{URL: "nats://user:hunter2@" + testenv.ClosedAddr(t)}, nil, quiet)
		if err == nil || !strings.Contains(err.Error(), "nats.url") || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("error %v: want one naming nats.url without its password", err)
		}
		if !errors.Is(err, nats.ErrNoServers) {
			t.Fatalf("error %v does not wrap nats.ErrNoServers", err)
		}
	})
	t.Run("nkey seed file", func(t *testing.T) {
		t.Parallel()
		seed := filepath.Join(t.TempDir(), "seed.nk")
		if err := os.WriteFile(seed, []byte("not a seed\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := backend.OpenNATS(config.NATS{URL: "nats://" + testenv.ClosedAddr(t), NkeySeedFile: seed}, nil, quiet)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Field != "nats.nkey_seed_file" {
			t.Fatalf("error %v: want a config error on nats.nkey_seed_file", err)
		}
	})
	t.Run("embedded listen", func(t *testing.T) {
		t.Parallel()
		if _, err := backend.OpenNATS(config.NATS{DataDir: t.TempDir(), Listen: "no-port"}, nil, quiet); err == nil {
			t.Fatal("an embedded server on a listen address without a port started")
		}
	})
}

// TestOpenNATSEmbeddedPullUser: with nats.user and a pull-mode lane, the
// embedded server has a pull user and NATS.Pull logs in as it: it may
// publish to the lane's workers' inboxes and nowhere else (not the
// JetStream API, a control subject, a lane's intake, the throttler's
// inbox, nor a publisher's inbox). The throttler's own connection uses
// queue.ThrottlerInbox; a publisher may subscribe to its own inbox only.
func TestOpenNATSEmbeddedPullUser(t *testing.T) {
	t.Parallel()
	listen := testenv.FreeAddr(t)
	cfg := config.NATS{DataDir: t.TempDir(), Listen: listen, User: "throttler", Password: "own-secret",
		Publishers: []config.Publisher{{User: "shop", Password: "shop-secret", Lanes: []string{"demo"}}},
		Workers:    []config.Worker{{User: "render-1", Password: "w-secret"}}}
	lanes := []config.Lane{{Name: "demo", MaxBody: 1 << 20},
		{Name: "renders", MaxBody: 1 << 20, Target: config.Target{NATS: &config.NATSTarget{Subject: "renders.work", Mode: config.NATSModePull}}}}
	n, err := backend.OpenNATS(cfg, lanes, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Pull == nil || n.Pull == n.Conn {
		t.Fatal("no pull connection of its own")
	}
	if got := n.Conn.Opts.InboxPrefix; got != queue.ThrottlerInbox {
		t.Errorf("the throttler's inbox prefix is %q, want %q", got, queue.ThrottlerInbox)
	}
	if !strings.HasPrefix(n.Conn.NewRespInbox(), queue.ThrottlerInbox+".") {
		t.Errorf("a JetStream reply inbox %q is outside %s", n.Conn.NewRespInbox(), queue.ThrottlerInbox)
	}

	// What the pull connection publishes is seen by the throttler's own
	// (all-powerful) connection, if the server lets it through.
	spy, err := n.Conn.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"$JS.API.STREAM.PURGE.THROTTLE_DEAD", "throttler.control.demo", "throttle.demo",
		queue.ThrottlerInbox + ".x", "_INBOX.shop.x", "_INBOX.render-1.ok"} {
		if err := n.Pull.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Pull.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := spy.NextMsg(5 * time.Second)
	if err != nil || m.Subject != "_INBOX.render-1.ok" {
		t.Fatalf("first message through the pull user: %v, %v; want only _INBOX.render-1.ok", m, err)
	}
	if m, err := spy.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("the pull user published on %s", m.Subject)
	}

	errs := make(chan error, 4)
	shop, err := nats.Connect("nats://"+listen, nats.UserInfo("shop", "shop-secret"), nats.CustomInboxPrefix(queue.UserInbox("shop")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	for _, subject := range []string{"_INBOX.>", queue.ThrottlerInbox + ".>"} {
		if _, err := shop.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		if err := shop.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("subscribe to %s: %v", subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a publisher subscribed to %s", subject)
		}
	}
	if _, err := shop.SubscribeSync("_INBOX.shop.>"); err != nil {
		t.Fatal(err)
	}
	if err := shop.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("a publisher may not read its own inbox: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestOpenNATSExternalPullLogin: on an external server, NATS.Pull logs in
// with nats.pull_login; with the documented pull user's permissions it can
// answer a worker's inbox and nothing else, and a wrong login fails the
// start naming nats.pull_login.
func TestOpenNATSExternalPullLogin(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATSWith(t, &server.Options{Port: -1, StoreDir: t.TempDir(), Users: []*server.User{
		{Username: "throttler", Password: "own-secret"},
		{Username: "throttler-pull", Password: "pull-secret", Permissions: queue.PullPermissions([]string{"render-1"}, []string{"renders.work"})},
	}})
	cfg := config.NATS{URL: srv.ClientURL(), User: "throttler", Password: "own-secret",
		PullLogin: config.NATSLogin{User: "throttler-pull", Password: "pull-secret"},
		Workers:   []config.Worker{{User: "render-1"}}}
	lanes := []config.Lane{{Name: "renders", Target: config.Target{NATS: &config.NATSTarget{Subject: "renders.work", Mode: config.NATSModePull}}}}
	n, err := backend.OpenNATS(cfg, lanes, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Pull == n.Conn {
		t.Fatal("nats.pull_login did not open a connection of its own")
	}
	spy, err := n.Conn.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"$JS.API.STREAM.DELETE.THROTTLE_renders", "throttler.control.renders", "_INBOX.render-1.ok"} {
		if err := n.Pull.Publish(subject, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Pull.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := spy.NextMsg(5 * time.Second); err != nil || m.Subject != "_INBOX.render-1.ok" {
		t.Fatalf("through the pull login: %v, %v; want only _INBOX.render-1.ok", m, err)
	}
	_ = spy.Unsubscribe() // nothing left for Close's drain to wait on

	cfg.PullLogin.Password = "wrong"
	if _, err := backend.OpenNATS(cfg, lanes, quiet); err == nil || !strings.Contains(err.Error(), "nats.pull_login") {
		t.Fatalf("a wrong pull login: %v, want an error naming nats.pull_login", err)
	}
}
