package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/instance"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// startAccountsNATS runs an in-process nats-server from a configuration
// file with two accounts, "blue" and "green", each with JetStream and one
// user of the same name (password "pw"), as docs/OPERATIONS.md shows it.
func startAccountsNATS(t *testing.T) *server.Server {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf(`listen: "127.0.0.1:-1"
jetstream { store_dir: %q }
accounts {
  blue:  { jetstream: enabled, users: [ { user: blue,  password: pw } ] }
  green: { jetstream: enabled, users: [ { user: green, password: pw } ] }
}
`, filepath.Join(dir, "store"))
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats.conf: %v", err)
	}
	return testenv.StartNATSWith(t, opts)
}

// TestTwoDeploymentsOneServer: two throttler deployments on one
// nats-server, each in its own NATS account, use the same stream, subject
// and key-value names without seeing each other: the same lane name, the
// same job ids, each an in-memory pacer (which the instance guard allows
// once per JetStream). Each target receives exactly its own jobs. A third
// instance in the blue account with its own in-memory pacer is refused,
// which is what sharing one account without separation would do.
func TestTwoDeploymentsOneServer(t *testing.T) {
	t.Parallel()
	srv := startAccountsNATS(t)
	url := srv.ClientURL()
	l := bucket.Limit{Rate: 100, Burst: 10}
	cfgFor := func(user, targetURL string) string {
		return fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, user: %s, password: pw}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
%s`, url, user, laneYAML("demo", l, targetURL))
	}
	blueTarget, greenTarget := newTarget(t), newTarget(t)
	blue := startInstance(t, "blue", cfgFor("blue", blueTarget.URL("demo")))
	green := startInstance(t, "green", cfgFor("green", greenTarget.URL("demo")))

	const jobs = 20
	cb, cg := newClient(t, blue.Addr()), newClient(t, green.Addr())
	cb.submitAll("demo", "job", jobs, 2) // the same ids in both
	cg.submitAll("demo", "job", jobs, 2)
	waitDelivered(t, cb, blueTarget, 30*time.Second)
	waitDelivered(t, cg, greenTarget, 30*time.Second)
	// Nothing is left that could arrive later: the counts are final.
	servicetest.WaitSettled(t, 10*time.Second, blue.Addr())
	servicetest.WaitSettled(t, 10*time.Second, green.Addr())
	for name, tg := range map[string]*target{"blue": blueTarget, "green": greenTarget} {
		if at := tg.arrivals(); len(at) != jobs || tg.distinct() != jobs {
			t.Errorf("%s target: %d arrivals of %d ids, want %d of %d", name, len(at), tg.distinct(), jobs, jobs)
		}
	}

	// The separation is the account's: a second deployment in the blue
	// account would share its streams; its in-memory pacer is refused.
	cfg, err := config.Parse("blue2.yaml", []byte(cfgFor("blue", blueTarget.URL("demo"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = service.New(cfg, slog.New(slog.DiscardHandler), nil).Run(ctx)
	if !errors.Is(err, instance.ErrConflict) || !strings.Contains(err.Error(), "in-memory pacer") {
		t.Fatalf("a second in-memory instance in the blue account: Run = %v, want the guard's conflict", err)
	}
}
