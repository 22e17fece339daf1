package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

type dashboard struct {
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

type namedExpr struct{ where, expr string }

// dashboardExprs is every PromQL expression of the dashboard: panel
// targets and variable queries.
func dashboardExprs(t *testing.T) []namedExpr {
	t.Helper()
	d := readDashboard(t)
	var out []namedExpr
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			out = append(out, namedExpr{"variable " + v.Name, v.Definition})
		}
	}
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out = append(out, namedExpr{fmt.Sprintf("panel %q target %d", p.Title, i), tg.Expr})
		}
	}
	return out
}

var (
	rangeRE       = regexp.MustCompile(`\[([^\]]*)\]`)
	throttlerSelR = regexp.MustCompile(`\bthrottler_[a-z0-9_]+(\{[^}]*\})?`)
)

// TestDashboardConventions: every rate and increase spans $__rate_interval
// (never a fixed window, which breaks at other scrape intervals); every
// selector follows the job and instance variables (and lane, where the
// metric has one); panels have unique ids, use the data source variable
// and do not overlap.
func TestDashboardConventions(t *testing.T) {
	d := readDashboard(t)
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for _, name := range []string{"datasource", "job", "instance", "lane"} {
		if vars[name] == "" {
			t.Errorf("no %s variable", name)
		}
	}
	if vars["job"] != "query" || vars["instance"] != "query" {
		t.Errorf("job and instance must be query variables: %v", vars)
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap", p.Title, other)
					goto next
				}
				taken[cell{x, y}] = p.Title
			}
		}
	next:
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range rangeRE.FindAllStringSubmatch(tg.Expr, -1) {
				if m[1] != "$__rate_interval" {
					t.Errorf("panel %q: range [%s], want [$__rate_interval]: %s", p.Title, m[1], tg.Expr)
				}
			}
			sels := throttlerSelR.FindAllStringSubmatch(tg.Expr, -1)
			if len(sels) == 0 {
				t.Errorf("panel %q: no throttler metric in %s", p.Title, tg.Expr)
			}
			for _, s := range sels {
				for _, want := range []string{`job=~"$job"`, `instance=~"$instance"`} {
					if !strings.Contains(s[1], want) {
						t.Errorf("panel %q: %s lacks %s", p.Title, s[0], want)
					}
				}
				if !laneless(s[0]) && !strings.Contains(s[1], `lane=~"$lane"`) {
					t.Errorf("panel %q: %s lacks lane=~\"$lane\"", p.Title, s[0])
				}
			}
		}
	}
	if len(d.Panels) < 12 {
		t.Fatalf("only %d panels read", len(d.Panels))
	}
}

// laneless says whether a selector's metric has no lane label: the build,
// the API's own requests and the backends' health.
func laneless(sel string) bool {
	for _, p := range []string{"throttler_build_info", "throttler_http_", "throttler_backend_"} {
		if strings.HasPrefix(sel, p) {
			return true
		}
	}
	return false
}
