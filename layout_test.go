package throttler_test

// The house rules that a reader of the code relies on, checked on every
// test run: imports run one way (ingest → admission → queue → leaky →
// dispatch, with the lane where they meet), the pure packages stay pure,
// and the table of packages in docs/DESIGN.md names every package.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/throttler/throttler"

// deps lists, for each of pkgs (directories such as ./internal/queue), the
// packages it depends on, directly or not: one go list for all of them.
func deps(t *testing.T, pkgs []string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-f", "{{.Dir}}{{range .Deps}} {{.}}{{end}}"}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(pkgs, " "), err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	all := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		rel, err := filepath.Rel(wd, f[0])
		if err != nil {
			t.Fatal(err)
		}
		all["./"+filepath.ToSlash(rel)] = f[1:]
	}
	for _, p := range pkgs {
		if _, ok := all[p]; !ok {
			t.Fatalf("go list printed nothing for %s:\n%s", p, out)
		}
	}
	return all
}

func TestImportRules(t *testing.T) {
	t.Parallel()
	internal := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, module+"/internal/"+n)
		}
		return out
	}
	rules := []struct {
		pkg    string
		forbid []string
		why    string
	}{
		{"internal/queue", internal("leaky", "lane", "dispatch", "ingest", "service", "admission"),
			"the JetStream adapter knows nothing of pacing or delivery"},
		{"internal/leaky", append(internal("queue", "dispatch", "service", "ingest", "lane", "admission", "config", "metrics"),
			"github.com/nats-io/nats.go", "github.com/redis/go-redis/v9", "github.com/prometheus/client_golang/prometheus"),
			"the pacer declares what it needs and imports no backend"},
		{"internal/keyed", append(internal("queue", "dispatch", "service", "ingest", "lane", "admission", "config", "metrics"),
			"github.com/nats-io/nats.go", "github.com/redis/go-redis/v9", "github.com/prometheus/client_golang/prometheus"),
			"the keyed pacer declares what it needs and imports no backend; its Redis adapter is redisclaims"},
		{"internal/dispatch", internal("queue", "leaky", "lane", "service", "ingest", "admission", "bucket", "config", "metrics", "instance"),
			"delivery depends on nothing above it"},
		{"internal/bucket", append(internal("queue", "leaky", "lane", "dispatch", "service", "ingest", "admission", "config"),
			"github.com/nats-io/nats.go", "github.com/redis/go-redis/v9", "github.com/prometheus/client_golang/prometheus"),
			"the GCRA math and the memory store are pure"},
		{"internal/admission", append(internal("queue", "leaky", "lane", "dispatch", "service", "ingest"),
			"github.com/nats-io/nats.go", "github.com/redis/go-redis/v9", "github.com/prometheus/client_golang/prometheus"),
			"the admission decision is pure; its stores come in through interfaces"},
		{"internal/lane", internal("service", "ingest"),
			"a lane knows nothing of the HTTP API or of the wiring"},
		{"internal/ingest", internal("config", "service", "apiserver", "backend", "lane"),
			"the HTTP handler takes plain values; apiserver turns the config file into them"},
		{"internal/queue", internal("config", "backend"),
			"the JetStream adapter takes plain values; backend opens NATS from the config file"},
		{"internal/backend", internal("service", "apiserver", "ingest", "lane", "admission"),
			"opening NATS and Redis knows nothing of lanes or of the API"},
		{"internal/apiserver", internal("service"),
			"the API's server is wired by service, never the other way"},
		{"internal/tracing", internal("queue", "leaky", "keyed", "lane", "dispatch", "service", "ingest", "admission", "config", "metrics"),
			"the tracer knows spans and OTLP/HTTP, nothing of lanes, jobs or the config file"},
		{"internal/tracectx", []string{module + "/internal/", "github.com/prometheus/", "github.com/nats-io/"},
			"W3C trace context is pure: checked strings and ids"},
		{"api", []string{module + "/internal/"},
			"the public wire types depend on nothing of the service"},
		{"client", []string{module + "/internal/", "github.com/nats-io/", "github.com/redis/", "github.com/prometheus/"},
			"the public Go client needs only the wire types and net/http: another module imports it"},
		{"worker", []string{module + "/internal/"},
			"a public package links nothing of the service into its users' programs"},
		{"internal/ui", append(internal("service", "ingest", "lane", "queue", "leaky", "dispatch", "admission", "bucket", "config", "metrics", "instance"), module+"/api"),
			"the status page's files speak the public HTTP API and import nothing of the service"},
		{"cmd/throttler", append(internal("bench", "testenv", "servicetest"), "go.uber.org/ratelimit", "github.com/go-redis/redis_rate/v10", "github.com/chromedp/chromedp"),
			"the service binary links no load tool, no peer library and no test support"},
	}
	var pkgs []string
	for _, rule := range rules {
		if _, err := os.Stat(rule.pkg); err != nil {
			t.Errorf("%s: %v", rule.pkg, err)
			continue
		}
		pkgs = append(pkgs, "./"+rule.pkg)
	}
	all := deps(t, pkgs)
	for _, rule := range rules {
		for _, dep := range all["./"+rule.pkg] {
			for _, f := range rule.forbid {
				if dep == f || strings.HasPrefix(dep, f+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f)) {
					t.Errorf("%s imports %s: %s", rule.pkg, dep, rule.why)
				}
			}
		}
	}
}

// TestDesignListsEveryPackage: every directory under internal/ (and the
// public packages) has its one-line job in the table under "## Packages" in
// docs/DESIGN.md. Only that section counts: the summary at the top of the
// page names parts too, and a package named there alone is not listed.
func TestDesignListsEveryPackage(t *testing.T) {
	t.Parallel()
	design, err := os.ReadFile("docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(design)
	start := strings.Index(doc, "\n## Packages\n")
	if start < 0 {
		t.Fatal(`docs/DESIGN.md has no "## Packages" section`)
	}
	table := doc[start+1:]
	if end := strings.Index(table, "\n## "); end >= 0 {
		table = table[:end]
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)`")
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		listed[strings.TrimSuffix(m[1], "/")] = true
	}
	if len(listed) == 0 {
		t.Fatal(`the "## Packages" section of docs/DESIGN.md has no rows`)
	}
	var dirs []string
	for _, glob := range []string{"internal/*", "internal/*/*", "cmd/*", "api", "client", "worker"} {
		found, _ := filepath.Glob(glob)
		dirs = append(dirs, found...)
	}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() || strings.Contains(d, "testdata") {
			continue
		}
		if gos, _ := filepath.Glob(filepath.Join(d, "*.go")); len(gos) == 0 {
			continue
		}
		if !listed[d] && !listed[filepath.Base(d)] {
			t.Errorf("docs/DESIGN.md's table of packages does not list %s", d)
		}
	}
}
