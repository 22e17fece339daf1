package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// lanesAnswer is a GET /v1/lanes answer with what the service's own
// browser test (internal/service) cannot produce there: a keyed lane with
// its key counts and busiest keys, a lane slowed by adaptive mode, a quota
// and a sub-1/s rate.
const lanesAnswer = `{"lanes":[
 {"name":"tenants","rate":100,"effective_rate":100,"burst":20,"max_inflight":32,"max_backlog":100000,
  "target":"POST https://api.example.com/hook","backlog":4200,"waiting":4180,"in_flight":20,"delivered":0,
  "dead":0,"retrying":3,"paused":false,"adaptive":false,"utilization":1.01,"recent_429":0,"recent_429_seconds":60,
  "keyed":{"per_key_rate":5,"per_key_burst":2,"per_key_max_inflight":2,"ordered":true,"keys_active":312,"keys_paused":4},
  "keys":[{"key":"acme","backlog":900,"in_flight":2},{"key":"globex","backlog":1500,"in_flight":2,"paused":true},
   {"key":"initech","backlog":10},{"key":"umbrella","backlog":300},{"key":"hooli","backlog":20},{"key":"wayne","backlog":1}]},
 {"name":"slow","rate":0.5,"effective_rate":0.25,"burst":1,"max_inflight":4,"max_backlog":1000,"target":"nats jobs.slow",
  "backlog":950,"waiting":949,"in_flight":1,"delivered":0,"dead":0,"retrying":0,"paused":false,"adaptive":true,
  "utilization":0.5,"recent_429":7,"recent_429_seconds":60,"quota":{"limit":1800,"per":"1h0m0s","burst":1}}]}`

type rendered struct {
	Summary string   `json:"summary"`
	Keys    []string `json:"keys"`
	Globex  string   `json:"globex"`
	State   string   `json:"state"`
	Hold    string   `json:"hold"`
	Rate    string   `json:"rate"`
	ETA     string   `json:"eta"`
	R429    string   `json:"r429"`
	Login   bool     `json:"login"`
	// The tenants lane's throughput chart: its points and caption; the
	// slow lane's caption (no samples yet).
	Points     []string `json:"points"`
	Area       int      `json:"area"`
	SparkText  string   `json:"sparkText"`
	SlowSpark  string   `json:"slowSpark"`
	SparkWidth float64  `json:"sparkWidth"`
}

// TestPageRendersLaneKinds renders a synthetic lanes answer in headless
// chromium (the same flags as the service's browser test) and checks how
// the page shows a keyed lane (key counts, per-key limits, the five
// busiest keys by backlog) and an adaptive lane slowed to half its
// sub-1/s rate, with its quota, ETA and 429s. It fails when chromium is
// missing.
func TestPageRendersLaneKinds(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("this test needs Debian's chromium, which is not installed (%v): apt-get install -y chromium (.ci/run installs it)", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ui/", Handler())
	mux.HandleFunc("GET /v1/whoami", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"anonymous":true,"admin":true,"read":true,"submit":true}`))
	})
	mux.HandleFunc("GET /v1/lanes", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(lanesAnswer))
	})
	mux.HandleFunc("GET /v1/lanes/{lane}/history", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.PathValue("lane") != "tenants" {
			fmt.Fprintf(w, `{"lane":%q,"interval_seconds":5,"samples":[]}`, r.PathValue("lane"))
			return
		}
		w.Write([]byte(`{"lane":"tenants","interval_seconds":5,"samples":[
		  {"at":"2026-01-01T00:00:00Z","starts_per_second":40,"backlog":900},
		  {"at":"2026-01-01T00:00:05Z","starts_per_second":100,"backlog":null},
		  {"at":"2026-01-01T00:00:10Z","starts_per_second":90,"backlog":700}]}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	profile := t.TempDir()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(bin),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(profile), chromedp.WindowSize(1366, 768))
	defer cancelAlloc()
	bctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()

	var mu sync.Mutex
	var problems []string
	console := chromedp.Console(ctx)
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				problems = append(problems, m.Text)
				mu.Unlock()
			}
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`tr.detail[data-lane="tenants"] .keyed-summary`))); err != nil {
		t.Fatalf("the page did not show the keyed lane: %v", err)
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[rendered](`(() => {
	  const d = document.querySelector('tr.detail[data-lane="tenants"]');
	  const slow = (f) => document.querySelector('tr.lane[data-lane="slow"] td[data-field="' + f + '"]').textContent;
	  return {
	    summary: d.querySelector(".keyed-summary").textContent,
	    keys: Array.from(d.querySelectorAll(".key")).map((k) => k.dataset.key),
	    globex: d.querySelector('.key[data-key="globex"]').textContent,
	    state: document.querySelector('tr.lane[data-lane="slow"] td[data-field="state"] .badges').textContent,
	    hold: document.querySelector('tr.lane[data-lane="slow"] button.hold').textContent,
	    rate: slow("rate"), eta: slow("eta"), r429: slow("r429"),
	    login: !document.getElementById("login").hidden,
	    points: (document.querySelector('tr.lane[data-lane="tenants"] svg.spark .starts').getAttribute("points") || "").split(" ").filter(Boolean),
	    area: (document.querySelector('tr.lane[data-lane="tenants"] svg.spark .backlog').getAttribute("points") || "").split(" ").filter(Boolean).length,
	    sparkText: document.querySelector('tr.lane[data-lane="tenants"] [data-field="history"] .sub').textContent,
	    slowSpark: document.querySelector('tr.lane[data-lane="slow"] [data-field="history"] .sub').textContent,
	    sparkWidth: document.querySelector('tr.lane[data-lane="tenants"] svg.spark').getBoundingClientRect().width,
	  };
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"keyed", "312 keys active", "4 paused", "per key 5/s, burst 2", "2 in flight per key", "ordered"} {
		if !strings.Contains(got.Summary, want) {
			t.Errorf("keyed summary %q lacks %q", got.Summary, want)
		}
	}
	if strings.Join(got.Keys, ",") != "globex,acme,umbrella,hooli,initech" || !strings.Contains(got.Globex, "paused") {
		t.Errorf("busiest keys %v (globex: %q); want the five with the largest backlog, globex paused", got.Keys, got.Globex)
	}
	if got.State != "runningadaptive 50%" || got.Hold != "Pause" || got.Rate != "15/minof 30/minquota 1,800 per 1h" || got.ETA != "1 h 3 min" || got.R429 != "7" || got.Login {
		t.Errorf("slow lane: %+v", got)
	}
	// The throughput line: one point a sample, the newest at the right
	// edge, the lane's full rate (100/s) at the top, 90/s just under it;
	// the backlog area
	// closes along the bottom (3 samples and 2 corners).
	if len(got.Points) != 3 || got.Points[2] != "120.0,4.2" || got.Points[1] != "119.0,1.0" || got.Points[0] != "118.0,20.2" || got.Area != 5 {
		t.Errorf("tenants' throughput line %v (area %d points); want 3 points ending at the right edge", got.Points, got.Area)
	}
	if got.SparkText != "90/s now · peak 100/s" || got.SlowSpark != "collecting…" || got.SparkWidth != 120 {
		t.Errorf("throughput captions %q / %q, width %v", got.SparkText, got.SlowSpark, got.SparkWidth)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("the page logged errors: %v", problems)
	}
}

// TestPageListsRecentJobs: a lane that keeps job records shows its recent
// jobs by state in its detail row, and a click on a job id opens its
// record (as text). It fails when chromium is missing.
func TestPageListsRecentJobs(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("this test needs Debian's chromium, which is not installed (%v): apt-get install -y chromium (.ci/run installs it)", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ui/", Handler())
	mux.HandleFunc("GET /v1/whoami", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"anonymous":true,"admin":true,"read":true,"submit":true}`))
	})
	mux.HandleFunc("GET /v1/lanes", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"lanes":[{"name":"geo","rate":2,"effective_rate":2,"burst":1,"max_inflight":4,"max_backlog":1000,
		 "target":"POST http://127.0.0.1:9000/geocode","results":true,"backlog":1,"waiting":1,"in_flight":0,"delivered":2,"dead":0,
		 "retrying":0,"paused":false,"adaptive":false,"utilization":0.5,"recent_429":0,"recent_429_seconds":60}]}`))
	})
	mux.HandleFunc("GET /v1/lanes/{lane}/history", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"lane":"geo","interval_seconds":5,"samples":[]}`))
	})
	mux.HandleFunc("GET /v1/lanes/geo/jobs", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"jobs":[
		 {"v":1,"id":"addr-3","lane":"geo","state":"queued","stored_at":"2026-01-01T00:00:02Z","attempts":[]},
		 {"v":1,"id":"addr-2","lane":"geo","state":"delivered","finished_at":"2026-01-01T00:00:01Z","attempts":[{"at":"2026-01-01T00:00:01Z","status":200,"duration_ms":1}]},
		 {"v":1,"id":"<b>addr-1</b>","lane":"geo","state":"in_flight","attempts":[{"at":"2026-01-01T00:00:00Z","error":"timeout","duration_ms":10000}]}]}`))
	})
	mux.HandleFunc("GET /v1/lanes/geo/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"v":1,"id":%q,"lane":"geo","state":"delivered","attempts":[],"response":{"status":200,"body":"<script>x</script>"}}`, r.PathValue("id"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	profile := t.TempDir()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(bin),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(profile), chromedp.WindowSize(1366, 768))
	defer cancelAlloc()
	bctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`tr.detail[data-lane="geo"] .jobs h3`))); err != nil {
		t.Fatalf("the page did not show the lane's jobs: %v", err)
	}
	type jobsView struct {
		Title  string   `json:"title"`
		IDs    []string `json:"ids"`
		States []string `json:"states"`
		Last   []string `json:"last"`
		Bold   int      `json:"bold"`
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[jobsView](`(() => {
	  const d = document.querySelector('tr.detail[data-lane="geo"] .jobs');
	  return {
	    title: d.querySelector("h3").textContent,
	    ids: Array.from(d.querySelectorAll("tr.job button.open-job")).map((b) => b.textContent),
	    states: Array.from(d.querySelectorAll("tr.job")).map((r) => r.dataset.state),
	    last: Array.from(d.querySelectorAll("tr.job")).map((r) => r.children[3].textContent),
	    bold: d.querySelectorAll("b").length,
	  };
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Title != "Recent jobs (last 3): 1 queued · 1 delivered · 1 in flight" || strings.Join(got.IDs, ",") != "addr-3,addr-2,<b>addr-1</b>" ||
		strings.Join(got.States, ",") != "queued,delivered,in_flight" || strings.Join(got.Last, ",") != "—,HTTP 200,timeout" || got.Bold != 0 {
		t.Fatalf("jobs shown: %+v", got)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`button.open-job[data-id="addr-2"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.detail[data-lane="geo"] pre.record`))); err != nil {
		t.Fatal(err)
	}
	rec, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('tr.detail[data-lane="geo"] pre.record').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rec, `"id": "addr-2"`) || !strings.Contains(rec, `<script>x</script>`) {
		t.Fatalf("opened record: %q", rec)
	}
}
