package service_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
)

// gate is an HTTP target that holds every request whose job id hold picks
// until the request is cancelled (the throttler gave up on it) or the test
// ends, and answers the others with answer(id). It notes every arrival in
// order.
type gate struct {
	mu      sync.Mutex
	order   []string
	at      []time.Time
	hold    func(id string) bool
	answer  func(id string, w http.ResponseWriter)
	arrived chan string
	url     string
	freed   chan struct{}
	free    sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{arrived: make(chan string, 1000), freed: make(chan struct{})}
	rec := newRecorder(t)
	released := make(chan struct{})
	// Cleanups run last-in first-out: held requests end before the
	// recorder's server closes (it waits for them).
	t.Cleanup(func() { close(released) })
	rec.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		id := r.Header.Get("Idempotency-Key")
		g.mu.Lock()
		g.order = append(g.order, id)
		g.at = append(g.at, time.Now())
		hold, answer := g.hold, g.answer
		g.mu.Unlock()
		g.arrived <- id
		if hold != nil && hold(id) {
			select {
			case <-r.Context().Done():
				return
			case <-released:
				return
			case <-g.freed:
			}
		}
		if answer != nil {
			answer(id, w)
		}
	})
	g.url = rec.srv.URL
	return g
}

// release lets every held request through, and those held later too.
func (g *gate) release() { g.free.Do(func() { close(g.freed) }) }

func (g *gate) set(hold func(string) bool, answer func(string, http.ResponseWriter)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hold, g.answer = hold, answer
}

// arrivals returns the ids in arrival order and their times.
func (g *gate) arrivals() ([]string, []time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.order...), append([]time.Time(nil), g.at...)
}

func (g *gate) count(id string) int {
	ids, _ := g.arrivals()
	n := 0
	for _, got := range ids {
		if got == id {
			n++
		}
	}
	return n
}

// await waits for n more arrivals.
func (g *gate) await(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for range n {
		select {
		case <-g.arrived:
		case <-deadline:
			ids, _ := g.arrivals()
			t.Fatalf("waited %v for %d arrivals; the target saw %v", within, n, ids)
		}
	}
}

// TestRetryGoesBehindTheBacklog: a job that fails waits for its not-before
// time (the target's Retry-After, 1 s) and then queues behind every job
// that was waiting when it came due; it is not delivered again earlier.
func TestRetryGoesBehindTheBacklog(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	failed := make(chan time.Time, 1)
	submitted := make(chan struct{})
	g.set(nil, func(id string, w http.ResponseWriter) {
		if id == "first" && g.count("first") == 1 {
			// The failure comes once every job below is stored.
			<-submitted
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusInternalServerError)
			failed <- time.Now()
		}
	})
	cfg := retryConfig(t, g.url, 3)
	cfg.Lanes[0].Rate, cfg.Lanes[0].Burst = mustRate(t, "10/s"), 1
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	// "first" is delivered at once and fails; 30 jobs wait behind it at
	// 10/s, about 3 s of backlog, longer than the 1 s retry wait.
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "first", "x"); code != http.StatusAccepted {
		t.Fatalf("status %d", code)
	}
	const jobs = 30
	for i := range jobs {
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("b-%02d", i), "x"); code != http.StatusAccepted {
			t.Fatalf("job %d: status %d", i, code)
		}
	}
	close(submitted)
	failedAt := <-failed
	waitFor(t, 20*time.Second, "every job and the retry", func() bool { ids, _ := g.arrivals(); return len(ids) == jobs+2 })
	ids, at := g.arrivals()
	if ids[0] != "first" {
		t.Fatalf("first arrival %s", ids[0])
	}
	var retryAt time.Time
	for i, id := range ids[1:] {
		if id == "first" {
			retryAt = at[i+1]
			if i+1 != len(ids)-1 {
				t.Fatalf("the retry arrived at position %d of %d, ahead of %v: it must queue behind the backlog", i+1, len(ids), ids[i+2:])
			}
		}
	}
	if wait := retryAt.Sub(failedAt); wait < time.Second {
		t.Fatalf("the retry came %v after the failure, before its not-before time (Retry-After: 1)", wait)
	}
	// The test shows what it claims only if jobs were still waiting when
	// the retry came due.
	if last := at[len(at)-2]; last.Before(failedAt.Add(time.Second)) {
		t.Fatalf("the backlog was gone %v after the failure, before the retry came due: submitting took too long to test the order", last.Sub(failedAt))
	}
	if d := deadList(t, svc.Addr()); len(d) != 0 {
		t.Fatalf("dead letters: %+v", d)
	}
}

func mustRate(t *testing.T, s string) bucket.Rate {
	t.Helper()
	r, err := bucket.ParseRate(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestShutdownTimeoutReleasesInflight: deliveries still running when
// shutdown_timeout expires are cancelled and their jobs go back to the
// queue as they were (no attempt counted, nothing dead, nothing lost): the
// next start delivers each of them once.
func TestShutdownTimeoutReleasesInflight(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	g.set(func(string) bool { return true }, nil)
	cfg := retryConfig(t, g.url, 1) // one attempt: a counted failure would be dead
	cfg.ShutdownTimeout = config.Duration(time.Second)
	svc, stop := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := range 3 {
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("slow-%d", i), "x"); code != http.StatusAccepted {
			t.Fatalf("status %d", code)
		}
	}
	g.await(t, 3, 10*time.Second)
	began := time.Now()
	stop()
	if took := time.Since(began); took < time.Second || took > 6*time.Second {
		t.Fatalf("stopped after %v; shutdown_timeout is 1s", took)
	}

	g.set(nil, nil) // the target answers 200 from now on
	svc2, _ := start(t, cfg)
	waitFor(t, 10*time.Second, "the 3 released jobs", func() bool { return getLanes(t, svc2.Addr()).Lanes[0].Delivered == 3 })
	for i := range 3 {
		if n := g.count(fmt.Sprintf("slow-%d", i)); n != 2 {
			t.Errorf("slow-%d reached the target %d times, want 2 (cut short, then delivered)", i, n)
		}
	}
	if d := deadList(t, svc2.Addr()); len(d) != 0 {
		t.Fatalf("dead letters: %+v", d)
	}
	if l := getLanes(t, svc2.Addr()).Lanes[0]; l.Backlog != 0 || l.Retrying != 0 {
		t.Fatalf("after the restart: backlog %d, retrying %d", l.Backlog, l.Retrying)
	}
}

// TestReadyzFailsDuringAStop: once a stop began, and while a delivery is
// still finishing, nothing answers /readyz with 200: the listener is closed
// (a load balancer's new probe is refused) and a probe that was already on
// its way is answered 503 or cut off (net/http closes a connection whose
// request completes after the server began shutting down). The handler's
// own 503 while stopping is ingest's TestReadyz.
func TestReadyzFailsDuringAStop(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	g.set(func(string) bool { return true }, nil)
	svc, stop := start(t, testConfig(t, t.TempDir(), g.url, 100, 5))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	if code := get(t, client, svc.Addr(), "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d before the stop", code)
	}
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "held", "x"); code != http.StatusAccepted {
		t.Fatalf("status %d", code)
	}
	g.await(t, 1, 10*time.Second)
	// A probe already on its way when the stop begins.
	conn, err := net.Dial("tcp", svc.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /readyz HTTP/1.1\r\nHost: "+svc.Addr()+"\r\n"); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	waitFor(t, 5*time.Second, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", svc.Addr(), time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	io.WriteString(conn, "\r\n")
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "shutting down") {
			t.Fatalf("/readyz during the stop: %d %s, want 503 shutting down (or no answer)", resp.StatusCode, body)
		}
	}
	select {
	case <-stopped:
		t.Fatal("the stop ended while a delivery was still running (shutdown_timeout is 15s)")
	default:
	}
	if code := get(t, client, svc.Addr(), "/readyz"); code != 0 {
		t.Fatalf("/readyz answered %d during the stop", code)
	}
	g.release()
	<-stopped
}

// get returns the status of GET path (0 on a transport error).
func get(t *testing.T, client *http.Client, addr, path string) int {
	t.Helper()
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestReadyzWhileNATSIsAway: /readyz fails while the NATS server is down
// and passes again once the client reconnected.
func TestReadyzWhileNATSIsAway(t *testing.T) {
	t.Parallel()
	natsDir := t.TempDir()
	srv := testenv.StartNATSDir(t, natsDir, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.NATS.URL = srv.ClientURL()
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	if code := get(t, client, svc.Addr(), "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d with NATS up", code)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	waitFor(t, 10*time.Second, "/readyz to fail with NATS down", func() bool {
		return get(t, client, svc.Addr(), "/readyz") == http.StatusServiceUnavailable
	})
	if code := get(t, client, svc.Addr(), "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d with NATS down: the process is alive", code)
	}
	testenv.StartNATSDir(t, natsDir, port)
	waitFor(t, 20*time.Second, "/readyz to pass after NATS came back", func() bool {
		return get(t, client, svc.Addr(), "/readyz") == http.StatusOK
	})
}

// deadPage is one page of GET …/dead.
type deadPage struct {
	Dead      []api.DeadLetter `json:"dead"`
	NextAfter uint64           `json:"next_after"`
}

func do(t *testing.T, client *http.Client, method, url string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// TestDeadLetterAdmin: the dead-letter endpoints page by after/limit,
// delete one, refuse a replay into a full lane without losing the dead
// letter, and replay all, each job once, with its id.
func TestDeadLetterAdmin(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	dead := func(id string) bool { return strings.HasPrefix(id, "dead-") }
	g.set(nil, func(id string, w http.ResponseWriter) {
		if dead(id) {
			w.WriteHeader(http.StatusNotFound) // a refusal: dead at once
		}
	})
	cfg := retryConfig(t, g.url, 3)
	cfg.Lanes[0].MaxBacklog, cfg.Lanes[0].MaxInflight = 4, 1 // room for the 4 replayed at once
	svc, _ := start(t, cfg)
	base := "http://" + svc.Addr() + "/v1/lanes/demo/dead"
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := range 5 {
		// One at a time: the lane holds at most 4.
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("dead-%d", i), fmt.Sprintf("p%d", i)); code != http.StatusAccepted {
			t.Fatalf("status %d", code)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("%d dead letters", i+1), func() bool { return len(deadList(t, svc.Addr())) == i+1 })
	}

	// Paging: oldest first, next_after only on a full page.
	page := func(query string) deadPage {
		t.Helper()
		code, body := do(t, client, "GET", base+query)
		var p deadPage
		if code != http.StatusOK || json.Unmarshal(body, &p) != nil {
			t.Fatalf("GET dead%s: %d %s", query, code, body)
		}
		return p
	}
	var seen []api.DeadLetter
	p := page("?limit=2")
	for pages := 0; ; pages++ {
		seen = append(seen, p.Dead...)
		if p.NextAfter == 0 {
			break
		}
		if len(p.Dead) != 2 || p.NextAfter != p.Dead[1].Seq || pages > 5 {
			t.Fatalf("page %d: %+v", pages, p)
		}
		p = page(fmt.Sprintf("?limit=2&after=%d", p.NextAfter))
	}
	if len(seen) != 5 {
		t.Fatalf("paging saw %d dead letters, want 5: %+v", len(seen), seen)
	}
	for i, d := range seen {
		if want := fmt.Sprintf("dead-%d", i); d.ID != want || (i > 0 && d.Seq <= seen[i-1].Seq) {
			t.Fatalf("page order: %d is %s (seq %d), want %s in rising seqs", i, d.ID, d.Seq, want)
		}
	}

	// Delete one.
	if code, body := do(t, client, "DELETE", fmt.Sprintf("%s/%d", base, seen[0].Seq)); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, _ := do(t, client, "GET", fmt.Sprintf("%s/%d", base, seen[0].Seq)); code != http.StatusNotFound {
		t.Fatalf("deleted dead letter: GET %d, want 404", code)
	}
	if n := len(deadList(t, svc.Addr())); n != 4 {
		t.Fatalf("%d dead letters after deleting one, want 4", n)
	}

	// Fill the lane (max_backlog 4): one job held by the target, three
	// waiting.
	g.set(func(id string) bool { return strings.HasPrefix(id, "fill-") }, nil)
	for i := range 4 {
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("fill-%d", i), "x"); code != http.StatusAccepted {
			t.Fatalf("fill %d: status %d", i, code)
		}
	}
	waitFor(t, 5*time.Second, "the lane to be full", func() bool { return getLanes(t, svc.Addr()).Lanes[0].Backlog == 4 })
	for _, path := range []string{fmt.Sprintf("/%d/replay", seen[1].Seq), "/replay"} {
		code, body := do(t, client, "POST", base+path)
		var prob problem
		json.Unmarshal(body, &prob)
		if code != http.StatusTooManyRequests || prob.Field != "max_backlog" {
			t.Fatalf("replay%s into a full lane: %d %s, want 429 naming max_backlog", path, code, body)
		}
	}
	if n := len(deadList(t, svc.Addr())); n != 4 {
		t.Fatalf("%d dead letters after refused replays, want all 4 kept", n)
	}

	// Empty the lane, fix the target, replay all.
	g.set(nil, nil)
	g.release()
	waitFor(t, 15*time.Second, "the lane to empty", func() bool { return getLanes(t, svc.Addr()).Lanes[0].Backlog == 0 })
	code, body := do(t, client, "POST", base+"/replay")
	var replayed struct {
		Replayed int `json:"replayed"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &replayed) != nil || replayed.Replayed != 4 {
		t.Fatalf("replay all: %d %s, want 4 replayed", code, body)
	}
	waitFor(t, 10*time.Second, "the 4 replayed jobs", func() bool {
		for i := 1; i < 5; i++ {
			if g.count(fmt.Sprintf("dead-%d", i)) < 2 {
				return false
			}
		}
		return true
	})
	waitFor(t, 5*time.Second, "the lane to settle", func() bool {
		l := getLanes(t, svc.Addr()).Lanes[0]
		return l.Backlog == 0 && l.Retrying == 0
	})
	if n := g.count("dead-0"); n != 1 {
		t.Errorf("the deleted dead-0 reached the target %d times, want 1", n)
	}
	for i := 1; i < 5; i++ {
		if n := g.count(fmt.Sprintf("dead-%d", i)); n != 2 {
			t.Errorf("dead-%d reached the target %d times, want 2 (dead, then replayed once)", i, n)
		}
	}
	if d := deadList(t, svc.Addr()); len(d) != 0 {
		t.Fatalf("dead letters after replay all: %+v", d)
	}
}
