package ingest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/metrics"
)

// TestRejectReasonsExistFromStart: every reason the submit handler counts
// in throttler_jobs_rejected_total (the string passed to its reject
// function) is one metrics.InitLane creates at 0, so the first refusal of
// each kind is an increase an alert can see. The reasons are read from
// this package's source.
func TestRejectReasonsExistFromStart(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	used := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			// reject(p, reason, retry): the rejecter's method, or a local
			// function of that name.
			name := ""
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			}
			if name != "reject" || len(call.Args) < 2 {
				return true
			}
			lit, ok := call.Args[1].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: reject called with a reason that is not a string literal; this test cannot check it", fset.Position(call.Pos()))
				return true
			}
			reason, _ := strconv.Unquote(lit.Value)
			used[reason] = true
			return true
		})
	}
	if len(used) < 10 {
		t.Fatalf("found only %d reasons in the source (%v); the scan is broken", len(used), used)
	}

	reg := prometheus.NewRegistry()
	metrics.New(reg).InitLane("demo")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]bool{}
	for _, f := range families {
		if f.GetName() != "throttler_jobs_rejected_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var lane, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "lane":
					lane = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			if lane == "demo" {
				created[reason] = true
			}
		}
	}
	for r := range used {
		if !created[r] {
			t.Errorf("reason %q is counted by the handler but not created at 0 by metrics.InitLane", r)
		}
	}
	for r := range created {
		if !used[r] {
			t.Errorf("metrics.InitLane creates reason %q, which the handler never counts", r)
		}
	}
}
