package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
)

// browser starts Debian's chromium headless with a fresh profile and no
// network beyond what the page asks of the test's server. It fails (never
// skips) when chromium is missing.
func browser(t *testing.T) context.Context {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the status page test needs Debian's chromium, which is not installed (%v): apt-get install -y chromium (.ci/run installs it)", err)
	}
	profile := t.TempDir() // removed after the browser is gone (cleanups run last-in first-out)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1366, 768), // a laptop screen
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", bin, err)
	}
	return ctx
}

// pageState is what the test reads of the page in one evaluation.
type pageState struct {
	Gen       int     `json:"gen"`
	Backlog   int64   `json:"backlog"`
	ETA       float64 `json:"eta"`
	R429      string  `json:"r429"`
	State     string  `json:"state"`
	Replays   int     `json:"replays"`
	Holds     int     `json:"holds"`
	DeadRows  []int64 `json:"deadRows"`
	Who       string  `json:"who"`
	Overflows bool    `json:"overflows"`
	// The demo lane's throughput chart: samples drawn, points of its line,
	// and whether any point stands above the baseline (starts > 0).
	HistoryPoints int  `json:"historyPoints"`
	LinePoints    int  `json:"linePoints"`
	LineRisen     bool `json:"lineRisen"`
}

const readPage = `(() => {
  const row = (lane) => document.querySelector('tr.lane[data-lane="' + lane + '"]');
  const demo = row("demo");
  const cell = (f) => demo ? demo.querySelector('td[data-field="' + f + '"]') : null;
  const b = cell("backlog");
  return {
    gen: +document.getElementById("updated").dataset.gen,
    backlog: b ? +b.querySelector(".big").dataset.value : -1,
    eta: cell("eta") ? +cell("eta").dataset.seconds : -1,
    r429: cell("r429") ? cell("r429").textContent : "",
    state: cell("state") ? cell("state").querySelector(".badges").textContent : "",
    holds: document.querySelectorAll("button.hold:not([hidden])").length,
    replays: document.querySelectorAll("button.replay, button.replay-all").length,
    deadRows: Array.from(document.querySelectorAll('tr.detail[data-lane="mail"] tr.dead-letter')).map((r) => +r.dataset.seq),
    who: document.getElementById("who").textContent,
    overflows: document.documentElement.scrollWidth > window.innerWidth,
    historyPoints: demo && demo.querySelector('[data-field="history"]') ? +demo.querySelector('[data-field="history"]').dataset.points : -1,
    linePoints: demo ? (demo.querySelector("svg.spark .starts").getAttribute("points") || "").split(" ").filter(Boolean).length : -1,
    lineRisen: demo ? (demo.querySelector("svg.spark .starts").getAttribute("points") || "").split(" ").filter(Boolean).some((p) => +p.split(",")[1] < 33) : false,
  };
})()`

// TestStatusPageInBrowser drives /ui in headless chromium against the real
// service with API keys: the page asks for a key, shows a row per lane,
// shows the backlog GET /v1/lanes reports while a burst drains and while
// the lane is paused by a 429, replays a dead letter for an admin key, and
// shows a read-only key no replay control (which the server refuses
// anyway). Screenshots go to the test's temp dir (and to $UI_SCREENSHOTS
// when set, to keep them).
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	var demoMode atomic.Int32 // 0: 200; 1: 429 with Retry-After
	var mailReject atomic.Bool
	var mu sync.Mutex
	got := map[string]int{} // job id -> deliveries answered 200
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch {
		case r.URL.Path == "/demo" && demoMode.Load() == 1:
			w.Header().Set("Retry-After", "40")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case r.URL.Path == "/mail" && mailReject.Load():
			http.Error(w, "no such mailbox", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	target := srv.URL
	mailReject.Store(true)

	cfg := testConfig(t, t.TempDir(), target+"/demo", 10, 1)
	cfg.Lanes[0].MaxInflight = 4
	mailRate, _ := bucket.ParseRate("50")
	mail := cfg.Lanes[0]
	mail.Name, mail.Rate, mail.Burst = "mail", mailRate, 5
	cfg.Lanes[0].Adaptive.Enabled = true // demo slows down on a 429
	mail.Target = config.Target{HTTP: &config.HTTPTarget{URL: target + "/mail", Method: "POST", Timeout: config.Duration(5 * time.Second)}}
	cfg.Lanes = append(cfg.Lanes, mail)
	cfg.Auth.Keys = []config.Key{
		{ID: "ops", SHA256: hexSum("ops-secret"), Scopes: []string{"admin"}},
		{ID: "viewer", SHA256: hexSum("viewer-secret"), Scopes: []string{"read"}},
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Throughput samples every 300 ms, so that the burst below draws a line.
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), nil)
	service.SetHistoryEvery(svc, 300*time.Millisecond)
	servicetest.Run(t, svc)
	base := "http://" + svc.Addr()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	lanes := func() map[string]api.LaneStatus {
		t.Helper()
		req, _ := http.NewRequest("GET", base+"/v1/lanes", nil)
		req.Header.Set("Authorization", "Bearer viewer-secret")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out api.Lanes
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil {
			t.Fatalf("GET /v1/lanes: %s", resp.Status)
		}
		m := map[string]api.LaneStatus{}
		for _, l := range out.Lanes {
			m[l.Name] = l
		}
		return m
	}
	post := func(lane, id string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/v1/lanes/"+lane+"/jobs", strings.NewReader(`{"n":1}`))
		req.Header.Set("Authorization", "Bearer ops-secret")
		req.Header.Set("Idempotency-Key", id)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit %s to %s: %s", id, lane, resp.Status)
		}
	}

	// Three dead letters on mail: its target refuses them.
	for i := range 3 {
		post("mail", fmt.Sprintf("letter-%d", i))
	}
	waitFor(t, 20*time.Second, "3 dead letters on mail", func() bool { return lanes()["mail"].Dead == 3 })
	mailReject.Store(false)

	ctx := browser(t)
	var pageErrors []string
	var perrMu sync.Mutex
	console := chromedp.Console(ctx)
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type != chromedp.ConsoleError && m.Type != chromedp.ConsoleException {
				continue
			}
			// Refusals the test asks for: the page's first call without a
			// key, and a replay with the read-only key.
			if strings.Contains(m.Text, "status of 401") || strings.Contains(m.Text, "status of 403") {
				continue
			}
			perrMu.Lock()
			pageErrors = append(pageErrors, string(m.Type)+": "+m.Text)
			perrMu.Unlock()
		}
	}()

	read := func() pageState {
		t.Helper()
		st, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage))
		if err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		return st
	}
	// waitGen waits until the page has shown the answer of a poll that
	// began after the page showed generation g: generation g+2 (polls never
	// overlap, so poll g+2 starts after poll g+1 ended).
	waitGen := func(g int) pageState {
		t.Helper()
		var st pageState
		waitFor(t, 30*time.Second, fmt.Sprintf("the page's poll %d", g+2), func() bool {
			st = read()
			return st.Gen >= g+2
		})
		return st
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
		if dir := os.Getenv("UI_SCREENSHOTS"); dir != "" {
			_ = os.WriteFile(filepath.Join(dir, name), png, 0o644)
		}
	}
	login := func(secret string) {
		t.Helper()
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(lctx,
			chromedp.WaitVisible(chromedp.CSS("#key")),
			chromedp.SendKeys(chromedp.CSS("#key"), secret),
			chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane="demo"]`)),
			chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane="mail"]`)),
		); err != nil {
			html, _ := chromedp.Run(ctx, chromedp.Evaluate[string]("document.body.outerHTML"))
			t.Fatalf("logging in with a key: %v\n%s", err, html)
		}
	}

	// The page's own files: strict headers.
	resp, err := client.Get(base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); resp.StatusCode != 200 || !strings.Contains(csp, "script-src 'self'") ||
		!strings.Contains(csp, "frame-ancestors 'none'") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("GET /ui/: %s, CSP %q, X-Frame-Options %q", resp.Status, csp, resp.Header.Get("X-Frame-Options"))
	}

	// Without a key the page asks for one, then shows a row per lane.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatal(err)
	}
	login("ops-secret")
	if st := read(); !strings.Contains(st.Who, "ops") || !strings.Contains(st.Who, "admin") {
		t.Fatalf("the page names the key as %q", st.Who)
	}

	// A burst drains at 10/s: every backlog the page shows lies between
	// GET /v1/lanes before the page's poll began and after it ended (the
	// backlog only falls while it drains), and its ETA is the backlog at
	// the rate.
	const burst = 120
	for i := range burst {
		post("demo", fmt.Sprintf("job-%d", i))
	}
	samples := 0
	for {
		before := lanes()["demo"].Backlog
		st := waitGen(read().Gen)
		after := lanes()["demo"].Backlog
		t.Logf("drain: GET /v1/lanes %d, page %d, GET /v1/lanes %d", before, st.Backlog, after)
		if st.Backlog < int64(after) || st.Backlog > int64(before) {
			t.Fatalf("the page shows a backlog of %d; GET /v1/lanes said %d before its poll and %d after", st.Backlog, before, after)
		}
		if want := float64(st.Backlog) / 10; st.Backlog > 0 && (st.ETA < want || st.ETA > want+1) {
			t.Fatalf("the page shows an ETA of %v s for %d jobs at 10/s", st.ETA, st.Backlog)
		}
		if st.Backlog > 0 && st.Backlog < burst {
			samples++
		}
		if after == 0 && st.Backlog == 0 {
			break
		}
	}
	if samples < 2 {
		t.Fatalf("only %d readings while the burst drained; want at least 2", samples)
	}
	// The throughput line: the samples GET /v1/lanes/demo/history holds,
	// drawn as points, some above the baseline (the burst's starts).
	waitFor(t, 20*time.Second, "the page to draw demo's throughput line", func() bool {
		st := read()
		return st.HistoryPoints >= 3 && st.LinePoints == st.HistoryPoints && st.LineRisen
	})
	req, _ := http.NewRequest("GET", base+"/v1/lanes/demo/history", nil)
	req.Header.Set("Authorization", "Bearer viewer-secret")
	hresp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var hist api.LaneHistory
	if err := json.NewDecoder(hresp.Body).Decode(&hist); err != nil || hresp.StatusCode != 200 {
		t.Fatalf("GET /v1/lanes/demo/history: %s %v", hresp.Status, err)
	}
	hresp.Body.Close()
	started := 0.0
	for _, s := range hist.Samples {
		started += s.StartsPerSecond * hist.IntervalSeconds
	}
	if st := read(); len(hist.Samples) < st.HistoryPoints || started < burst/2 {
		t.Fatalf("history: %d samples (page drew %d), %.0f starts in them; want the burst's %d starts mostly seen", len(hist.Samples), st.HistoryPoints, started, burst)
	}
	shot("throughput.png")

	// Replay of a dead letter: the admin sees three with a Replay button
	// each; one click and it leaves the page and the dead-letter stream.
	var st pageState
	waitFor(t, 20*time.Second, "the page to list mail's 3 dead letters", func() bool {
		st = read()
		return len(st.DeadRows) == 3
	})
	if st.Replays != 3+1 {
		t.Fatalf("an admin sees %d replay controls; want 3 and a replay-all", st.Replays)
	}
	seq := st.DeadRows[0]
	dead := lanes()["mail"]
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr.dead-letter[data-seq="%d"] button.replay`, seq))),
		chromedp.WaitNotPresent(chromedp.CSS(fmt.Sprintf(`tr.dead-letter[data-seq="%d"]`, seq)))); err != nil {
		t.Fatalf("replaying dead letter %d: %v", seq, err)
	}
	waitFor(t, 20*time.Second, "the replayed job to reach the target", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["letter-0"]+got["letter-1"]+got["letter-2"] == 1
	})
	if n := lanes()["mail"].Dead; n != dead.Dead-1 {
		t.Fatalf("after one replay mail has %d dead letters; want %d", n, dead.Dead-1)
	}

	// A 429 with Retry-After pauses the lane: the page shows it paused,
	// its 429s, and the very backlog GET /v1/lanes reports.
	demoMode.Store(1)
	for i := range 5 {
		post("demo", fmt.Sprintf("held-%d", i))
	}
	waitFor(t, 20*time.Second, "the lane to pause on a 429", func() bool {
		l := lanes()["demo"]
		return l.Paused && l.Recent429 > 0
	})
	before := lanes()["demo"]
	st = waitGen(read().Gen)
	after := lanes()["demo"]
	if before.Backlog != after.Backlog || st.Backlog != int64(after.Backlog) || after.Backlog != 5 {
		t.Fatalf("paused lane: GET /v1/lanes %d then %d, the page %d; want 5 throughout", before.Backlog, after.Backlog, st.Backlog)
	}
	if after.PausedUntil == nil || !after.PausedUntil.After(time.Now()) || !after.Adaptive || after.EffectiveRate >= after.Rate {
		t.Fatalf("GET /v1/lanes for the paused adaptive lane: paused_until %v, adaptive %v, effective rate %v of %v",
			after.PausedUntil, after.Adaptive, after.EffectiveRate, after.Rate)
	}
	if want := fmt.Sprintf("adaptive %d%%", int(100*after.EffectiveRate/after.Rate+0.5)); !strings.Contains(st.State, "paused until") || !strings.Contains(st.State, want) {
		t.Fatalf("the page shows the paused lane's state as %q; want paused until … and %s", st.State, want)
	}
	if n, _ := strconv.Atoi(st.R429); n < 1 {
		t.Fatalf("the page shows %q recent 429s for the paused lane", st.R429)
	}
	if st.Overflows {
		t.Fatal("the page is wider than a 1366-pixel laptop screen")
	}
	shot("status-admin.png")

	// A read-only key: the same rows and dead letters, no replay control,
	// and the server refuses a replay from the page anyway.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#forget"))); err != nil {
		t.Fatal(err)
	}
	login("viewer-secret")
	waitFor(t, 20*time.Second, "the read-only page to list mail's 2 dead letters", func() bool {
		st = read()
		return len(st.DeadRows) == 2
	})
	if st.Replays != 0 || st.Holds != 0 || !strings.Contains(st.Who, "viewer") || !strings.Contains(st.Who, "read") {
		t.Fatalf("a read-only key (%q) sees %d replay controls and %d pause buttons", st.Who, st.Replays, st.Holds)
	}
	code, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(
		`fetch("../v1/lanes/mail/dead/%d/replay", {method: "POST", headers: {Authorization: "Bearer " + sessionStorage.getItem("throttler.key")}}).then((r) => r.status)`,
		st.DeadRows[0]), chromedp.EvalAwaitPromise))
	if err != nil || code != http.StatusForbidden {
		t.Fatalf("a replay with the read-only key from the page: %d %v; want 403", code, err)
	}
	if n := lanes()["mail"].Dead; n != 2 {
		t.Fatalf("mail has %d dead letters after a refused replay; want 2", n)
	}
	shot("status-read-only.png")

	// Back as admin: Replay all takes two clicks (the first only arms it)
	// and empties the list.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#forget"))); err != nil {
		t.Fatal(err)
	}
	login("ops-secret")
	all := chromedp.CSS(`tr.detail[data-lane="mail"] button.replay-all`)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(all), chromedp.Click(all)); err != nil {
		t.Fatal(err)
	}
	if st := read(); len(st.DeadRows) != 2 || lanes()["mail"].Dead != 2 {
		t.Fatalf("one click on Replay all changed something: the page lists %v", st.DeadRows)
	}
	if err := chromedp.Do(ctx, chromedp.Click(all),
		chromedp.WaitNotPresent(chromedp.CSS(`tr.detail[data-lane="mail"] tr.dead-letter`))); err != nil {
		t.Fatalf("replaying all: %v", err)
	}
	waitFor(t, 20*time.Second, "every replayed job to reach the target", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["letter-0"]+got["letter-1"]+got["letter-2"] == 3
	})
	if n := lanes()["mail"].Dead; n != 0 {
		t.Fatalf("after Replay all mail has %d dead letters", n)
	}

	// Pause and resume a lane from the page (an admin key): one button per
	// lane; the server holds the lane, the badge says so, and the button
	// turns into Resume.
	if st := read(); st.Holds != 2 {
		t.Fatalf("an admin sees %d pause buttons; want one per lane (2)", st.Holds)
	}
	holdBtn := chromedp.CSS(`tr.lane[data-lane="mail"] button.hold`)
	if err := chromedp.Do(ctx, chromedp.Click(holdBtn),
		chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane="mail"] button.hold[data-paused="yes"]`))); err != nil {
		t.Fatalf("pausing mail from the page: %v", err)
	}
	if l := lanes()["mail"]; !l.PausedByOperator || !strings.Contains(l.PauseReason, "ops") {
		t.Fatalf("after Pause on the page the server has mail %+v", l)
	}
	waitFor(t, 10*time.Second, "the page to show mail paused by an operator", func() bool {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('tr.lane[data-lane="mail"] .badges').textContent`))
		return err == nil && strings.Contains(s, "paused by operator")
	})
	shot("status-lane-paused.png")
	if err := chromedp.Do(ctx, chromedp.Click(holdBtn),
		chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane="mail"] button.hold[data-paused="no"]`))); err != nil {
		t.Fatalf("resuming mail from the page: %v", err)
	}
	if l := lanes()["mail"]; l.PausedByOperator || l.Paused {
		t.Fatalf("after Resume on the page the server has mail %+v", l)
	}

	perrMu.Lock()
	defer perrMu.Unlock()
	if len(pageErrors) > 0 {
		t.Fatalf("the page logged errors (a CSP violation shows here):\n%s", strings.Join(pageErrors, "\n"))
	}
}

// TestStatusPageAnonymous: without API keys (a loopback listen) the page
// opens at once, asks for no key, and offers replay (an open API lets
// every caller act).
func TestStatusPageAnonymous(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "refused", http.StatusBadRequest) // every job becomes a dead letter
	}))
	t.Cleanup(srv.Close)
	svc, _ := start(t, testConfig(t, t.TempDir(), srv.URL, 100, 10))
	base := "http://" + svc.Addr()
	resp, err := pollClient.Post(base+"/v1/lanes/demo/jobs", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ctx := browser(t)
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx,
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`tr.lane[data-lane="demo"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.detail[data-lane="demo"] tr.dead-letter button.replay`)),
	); err != nil {
		t.Fatalf("the open page: %v", err)
	}
	st, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage))
	if err != nil {
		t.Fatal(err)
	}
	hidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("login").hidden && document.getElementById("forget").hidden`))
	if err != nil || !hidden || !strings.Contains(st.Who, "open API") {
		t.Fatalf("without keys the page shows a login form or a key (%q): %v", st.Who, err)
	}
}
