// Package deploy holds no code: its tests keep the example deployment files
// honest. The alerting rules pass promtool's checks and unit tests, the
// PrometheusRule carries the same rules, every metric the rules and the
// dashboard name exists in a running service, the dashboard follows
// Grafana's conventions, and the Kubernetes and Compose files load, pin
// version tags and keep their bounds.
package deploy

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite kubernetes/prometheusrule.yaml from prometheus/alerts.yml")

const (
	rulesFile      = "prometheus/alerts.yml"
	rulesTestFile  = "prometheus/alerts_test.yml"
	prometheusRule = "kubernetes/prometheusrule.yaml"
	dashboardFile  = "grafana/throttler-dashboard.json"
)

// promtool finds promtool, or fails saying how to install it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found on PATH; it checks and unit-tests the alerting rules. Install it: apt-get install prometheus (Debian ships promtool in that package)")
	}
	return path
}

// TestRulesPassPromtool: promtool accepts the rules and their unit tests
// pass (each alert fires where it should and stays quiet where it should
// not, the first dead letter of a lane included).
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// rulesDoc is the part of a rules file the tests read.
type rulesDoc struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestEveryAlertHasUnitTests: each alert of the rules file has a test
// case where it fires and one where it must not.
func TestEveryAlertHasUnitTests(t *testing.T) {
	var rules rulesDoc
	readYAML(t, rulesFile, &rules)
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, rulesTestFile, &tests)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if !fires[r.Alert] {
				t.Errorf("%s: no unit test where it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no unit test where it stays quiet", r.Alert)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d rules read from %s", n, rulesFile)
	}
}

// groupsNode returns the node of the groups: key of the rules file.
func groupsNode(t *testing.T) *yaml.Node {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "groups" {
			return root.Content[i+1]
		}
	}
	t.Fatalf("%s has no groups", rulesFile)
	return nil
}

const prometheusRuleHeader = `# The alerting rules of deploy/prometheus/alerts.yml as a PrometheusRule, for
# prometheus-operator (kube-prometheus-stack). Generated from that file:
#   go test ./deploy -run TestPrometheusRuleMatchesRules -update
# and checked against it by the same test, so the two cannot drift; edit
# alerts.yml, not this file. Your Prometheus may select rules by a label
# (e.g. release: kube-prometheus-stack): add it under metadata.labels.
# Remove it from kustomization.yaml if the cluster has no prometheus-operator.
`

// renderPrometheusRule wraps the rules file's groups in a PrometheusRule.
func renderPrometheusRule(t *testing.T) []byte {
	t.Helper()
	str := func(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }
	mapping := func(kv ...*yaml.Node) *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Content: kv} }
	doc := mapping(
		str("apiVersion"), str("monitoring.coreos.com/v1"),
		str("kind"), str("PrometheusRule"),
		str("metadata"), mapping(
			str("name"), str("throttler"),
			str("labels"), mapping(str("app.kubernetes.io/name"), str("throttler")),
		),
		str("spec"), mapping(str("groups"), groupsNode(t)),
	)
	var buf bytes.Buffer
	buf.WriteString(prometheusRuleHeader)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPrometheusRuleMatchesRules: the PrometheusRule holds exactly the
// rules file's groups. With -update it is written from them.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	if *update {
		if err := os.WriteFile(prometheusRule, renderPrometheusRule(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var rules rulesDoc
	readYAML(t, rulesFile, &rules)
	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       rulesDoc
	}
	readYAML(t, prometheusRule, &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("%s is a %s %s", prometheusRule, pr.APIVersion, pr.Kind)
	}
	if !reflect.DeepEqual(pr.Spec, rules) {
		t.Fatalf("%s differs from %s; run: go test ./deploy -run TestPrometheusRuleMatchesRules -update", prometheusRule, rulesFile)
	}
	var k struct {
		Resources []string `yaml:"resources"`
	}
	readYAML(t, "kubernetes/kustomization.yaml", &k)
	if !slices.Contains(k.Resources, filepath.Base(prometheusRule)) {
		t.Errorf("kustomization.yaml does not list %s", filepath.Base(prometheusRule))
	}
}

// registry runs a service the way cmd/throttler does (its registry holds
// throttler_build_info) until the test ends, and gathers its metrics. Its
// lane keeps records, so that the series of lanes with results exist.
func registry(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {data_dir: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
callers:
  per_ip: {limit: 120, window: 1m}
  plans: {free: {rate: 10/min, burst: 10}}
lanes:
  - name: demo
    rate: 20
    burst: 10
    results: {keep: 1h}
    target: {http: {url: "http://127.0.0.1:1/never"}}
`, t.TempDir())
	cfg, err := config.Parse("deploy-test.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewBuildInfo(metrics.Build{Version: "v0.0.0-test", Revision: "unknown", GoVersion: runtime.Version()}))
	svc := service.New(cfg, slog.New(slog.DiscardHandler), reg)
	stop := servicetest.Run(t, svc)
	defer stop()
	// One request, so that the API's request series exist (they are
	// labelled by status code, known only once answered).
	if resp, err := http.Get("http://" + svc.Addr() + "/healthz"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

var (
	// selectorRE finds a metric name and its optional label matchers.
	selectorRE = regexp.MustCompile(`\b((?:throttler|go|process)_[a-zA-Z0-9_]+|up)\b(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// scrapeLabels are added by Prometheus, not by the service.
var scrapeLabels = map[string]bool{"job": true, "instance": true}

// checkNames fails for every metric named in expr (from where) that the
// service does not expose, and for every label matched exactly (=) to a
// value none of its series has: a typo in a name or a label value makes a
// rule or a panel silently empty.
func checkNames(t *testing.T, families map[string]*dto.MetricFamily, where, expr string) int {
	t.Helper()
	n := 0
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		name, sel := m[1], m[2]
		if name == "up" {
			continue // Prometheus's own, per target
		}
		n++
		f := families[name]
		if f == nil {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && families[base] != nil && families[base].GetType() == dto.MetricType_HISTOGRAM {
					f = families[base]
				}
			}
		}
		if f == nil {
			t.Errorf("%s: %s is not a metric of the service", where, name)
			continue
		}
		for _, lm := range matcherRE.FindAllStringSubmatch(sel, -1) {
			label, op, value := lm[1], lm[2], lm[3]
			if op != "=" || scrapeLabels[label] || label == "le" || strings.Contains(value, "$") {
				continue
			}
			if !hasLabel(f, label, value) {
				t.Errorf("%s: no series of %s has %s=%q", where, name, label, value)
			}
		}
	}
	return n
}

func hasLabel(f *dto.MetricFamily, name, value string) bool {
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == name && l.GetValue() == value {
				return true
			}
		}
	}
	return false
}

// TestNamedMetricsExist: every metric (and every exact label value) the
// rules, their unit tests and the dashboard name is exposed by a running
// service with one lane, before any job: the per-lane series exist from
// the start.
func TestNamedMetricsExist(t *testing.T) {
	families := registry(t)
	n := 0
	var rules rulesDoc
	readYAML(t, rulesFile, &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n += checkNames(t, families, rulesFile+": "+r.Alert, r.Expr)
		}
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
		} `yaml:"tests"`
	}
	readYAML(t, rulesTestFile, &tests)
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			// Test series name lanes and outcomes of their own; the names
			// must be real.
			name, _, _ := strings.Cut(s.Series, "{")
			n += checkNames(t, families, rulesTestFile, name)
		}
	}
	for _, e := range dashboardExprs(t) {
		n += checkNames(t, families, dashboardFile+": "+e.where, e.expr)
	}
	if n < 40 {
		t.Fatalf("only %d metric references found; the scan is broken", n)
	}
}

// TestOperationsDocsFollowTheCode: docs/OPERATIONS.md's metrics table
// lists every throttler_ metric a running service exposes and nothing
// else, and its alerts table every rule of the rules file and nothing else.
func TestOperationsDocsFollowTheCode(t *testing.T) {
	raw, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	section := func(title string) string {
		start := strings.Index(doc, "\n## "+title+"\n")
		if start < 0 {
			t.Fatalf("OPERATIONS.md has no section %q", title)
		}
		rest := doc[start+1:]
		if end := strings.Index(rest[3:], "\n## "); end >= 0 {
			rest = rest[:end+3]
		}
		return rest
	}
	rowName := regexp.MustCompile("(?m)^\\| `([A-Za-z_]+)` \\|")
	rows := func(title string) map[string]bool {
		out := map[string]bool{}
		for _, m := range rowName.FindAllStringSubmatch(section(title), -1) {
			out[m[1]] = true
		}
		return out
	}

	// Registered only with Redis (the store that can lose states). The
	// caller quotas' metrics exist with a callers section, which the
	// registry's config has.
	// throttler_pull_replies_refused_total has series for pull-mode lanes
	// only.
	// The tracer's counters exist with tracing on (OTEL_* variables).
	conditional := map[string]bool{"throttler_pacer_states_restored_total": true, "throttler_pull_replies_refused_total": true,
		"throttler_trace_spans_exported_total": true, "throttler_trace_spans_dropped_total": true}
	documented := rows("Metrics")
	for name := range registry(t) {
		if strings.HasPrefix(name, "throttler_") && !documented[name] {
			t.Errorf("OPERATIONS.md's metrics table lacks %s", name)
		}
		delete(documented, name)
	}
	for name := range documented {
		if !conditional[name] {
			t.Errorf("OPERATIONS.md's metrics table lists %s, which the service does not expose", name)
		}
	}

	var rules rulesDoc
	readYAML(t, rulesFile, &rules)
	alerts := rows("Alerts")
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if !alerts[r.Alert] {
				t.Errorf("OPERATIONS.md's alerts table lacks %s", r.Alert)
			}
			delete(alerts, r.Alert)
		}
	}
	for name := range alerts {
		t.Errorf("OPERATIONS.md's alerts table lists %s, which %s does not have", name, rulesFile)
	}
}

// TestDocsNameRealMetrics: a metric named anywhere in the docs (README.md,
// docs/*.md) is one of OPERATIONS.md's metrics table, which
// TestOperationsDocsFollowTheCode ties to what the service exposes.
// Names ending in _ are prefixes (throttler_http_), not metrics.
func TestDocsNameRealMetrics(t *testing.T) {
	raw, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		t.Fatal("OPERATIONS.md has no section Metrics")
	}
	table := doc[start+1:]
	if end := strings.Index(table[3:], "\n## "); end >= 0 {
		table = table[:end+3]
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(throttler_[a-z_]+)` \\|").FindAllStringSubmatch(table, -1) {
		documented[m[1]] = true
	}
	if len(documented) < 30 {
		t.Fatalf("only %d metrics in OPERATIONS.md's table; the scan is broken", len(documented))
	}
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`\bthrottler_[a-z_]*[a-z]\b`)
	for _, f := range append(files, "../README.md") {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range slices.Compact(slices.Sorted(slices.Values(name.FindAllString(string(raw), -1)))) {
			base := n
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				base = strings.TrimSuffix(base, suffix)
			}
			if !documented[n] && !documented[base] {
				t.Errorf("%s names %s, which is not a metric of the service", filepath.Base(f), n)
			}
		}
	}
}

// TestEveryAlertHasARunbook: each rule's runbook_url points at a section of
// docs/OPERATIONS.md that exists (a heading whose GitHub anchor it names).
func TestEveryAlertHasARunbook(t *testing.T) {
	raw, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			title := strings.TrimSpace(strings.TrimLeft(h, "#"))
			a := strings.Map(func(r rune) rune {
				switch {
				case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
					return r
				case r >= 'A' && r <= 'Z':
					return r + 'a' - 'A'
				case r == ' ':
					return '-'
				}
				return -1
			}, title)
			anchors[a] = true
		}
	}
	const prefix = "https://github.com/throttler/throttler/blob/main/docs/OPERATIONS.md#"
	var rules rulesDoc
	readYAML(t, rulesFile, &rules)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, prefix)
			if !ok {
				t.Errorf("%s: runbook_url %q is not %s<section>", r.Alert, url, prefix)
				continue
			}
			if !anchors[anchor] {
				t.Errorf("%s: runbook_url names #%s, which docs/OPERATIONS.md has no heading for", r.Alert, anchor)
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url names #%s, not the alert's own section", r.Alert, anchor)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules read")
	}
}
