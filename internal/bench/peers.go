package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// peerRate is the rate of the peer rows: the pacing row's 100/s.
const peerRate = 100

// What a smoothing proxy gives up against the throttler, printed beside
// its figures.
const nginxGivesUp = "nginx gives up: durability (a held request lives in nginx's memory with the client's connection open; a reload, crash or client timeout loses it, and the client must retry), cross-instance exactness (each nginx paces alone: two instances send twice the rate), and queue bounds by time (beyond burst it answers 503 at once)"

// runPeers: the tools people use instead, on the same sink, rate and jobs
// as our lane: nginx limit_req in delay mode as a smoothing proxy.
func runPeers(ctx context.Context, e *env) ([]Result, error) {
	sk, err := startSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	n := max(int(peerRate*e.dur.Seconds()), 20)
	lim := bucket.Limit{Rate: peerRate, Burst: 1}
	name := fmt.Sprintf("peer: nginx limit_req (delay) @%d/s, %d jobs at once: |gap − period| p50 / p99 / max; busiest 1-s window; rate", peerRate, n)
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return []Result{skipRow(Peers, name, "—", "nginx not found (apt-get install nginx-light)")}, nil
	}
	ours, _, _, err := e.lanePacing(ctx, sk, lim, n, nil)
	if err != nil {
		return nil, err
	}
	peer, held, err := e.nginxPacing(ctx, bin, sk, n)
	if err != nil {
		return nil, err
	}
	rows := []Result{}
	cell := func(p pacing) string {
		return fmt.Sprintf("%s / %s / %s; %s in 1 s; %s", fmtDur(p.Dev.P50), fmtDur(p.Dev.P99), fmtDur(p.Dev.Max),
			fmtInt(int64(p.MaxPerSecond)), fmtRate(p.Achieved))
	}
	rows = append(rows, Result{
		ID: Peers, Scenario: name,
		Ours:      cell(ours),
		Reference: cell(peer),
		Ratio:     "p99 " + fmtRatio(float64(ours.Dev.P99), float64(peer.Dev.P99)),
		Goal:      "—",
		Verdict:   NoGoal,
		Note: fmt.Sprintf("nginx %s held up to %d requests open at once, the last for %s; %s",
			nginxVersion(bin), held.peak, fmtDur(held.longest), nginxGivesUp),
	})
	bname := fmt.Sprintf("peer: Benthos http_server → rate_limit → http_client @%d/s, %d jobs at once: same figures", peerRate, n)
	if e.cfg.Smoke {
		return append(rows, skipRow(Peers, bname, "—", "smoke: the Benthos peer (a module of its own, long to compile) is built in full runs only")), nil
	}
	bpeer, bheld, skip, err := e.benthosPacing(ctx, sk, n)
	switch {
	case err != nil:
		return rows, err
	case skip != "":
		return append(rows, skipRow(Peers, bname, "—", skip)), nil
	}
	return append(rows, Result{
		ID: Peers, Scenario: bname,
		Ours:      cell(ours),
		Reference: cell(bpeer),
		Ratio:     "p99 " + fmtRatio(float64(ours.Dev.P99), float64(bpeer.Dev.P99)),
		Goal:      "—",
		Verdict:   NoGoal,
		Note: fmt.Sprintf("Benthos v4.60.0 (local rate_limit of 1 per %s, max_in_flight 64) held up to %d requests open at once, the last for %s; %s",
			fmtDur(time.Second/peerRate), bheld.peak, fmtDur(bheld.longest), benthosGivesUp),
	}), nil
}

const benthosGivesUp = "Benthos gives up: durability (a request waits in the pipeline's memory, answered only when delivered; a restart loses it and the client must retry), cross-instance exactness (the local rate_limit is per process; a shared limit needs an external cache resource and is not exact), and bounds on the wait (nothing refuses a request that would wait too long)"

// benthosDir is the peer module, relative to the main module's root.
const benthosDir = "cmd/throttler-bench/peers/benthos"

// benthosPacing builds the Benthos peer (its own module, with the go
// command, when the tool runs inside this repository), starts it in front
// of sk at peerRate, sends n POSTs at once and returns the pacing of their
// arrivals. skip says why it could not run.
func (e *env) benthosPacing(ctx context.Context, sk *sink, n int) (pacing, heldStats, string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return pacing{}, heldStats{}, "the go command or this repository is not here to build the Benthos peer", nil
	}
	src := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), benthosDir)
	if _, err := os.Stat(filepath.Join(src, "go.mod")); err != nil {
		return pacing{}, heldStats{}, "no " + benthosDir + " here", nil
	}
	dir := e.dir("benthos")
	bin := filepath.Join(dir, "benthos-peer")
	e.prog.set("building the Benthos peer", 0, 1)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return pacing{}, heldStats{}, fmt.Sprintf("building the Benthos peer failed: %v: %s", err, lastLine(string(out))), nil
	}
	addr, err := freeAddr()
	if err != nil {
		return pacing{}, heldStats{}, "", err
	}
	cmd := exec.Command(bin, "--listen", addr, "--target", sk.URL, "--rate", fmt.Sprint(peerRate))
	logf, err := os.Create(filepath.Join(dir, "benthos.log"))
	if err != nil {
		return pacing{}, heldStats{}, "", err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return pacing{}, heldStats{}, "", fmt.Errorf("bench: benthos peer: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	if err := waitListen(addr, 20*time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "benthos.log"))
		return pacing{}, heldStats{}, "", fmt.Errorf("bench: benthos peer: %w: %s", err, lastLine(string(log)))
	}
	held, err := e.burstThrough(ctx, sk, "http://"+addr+"/post", n)
	if err != nil {
		return pacing{}, heldStats{}, "", fmt.Errorf("bench: through Benthos: %w", err)
	}
	arrivals, _ := sk.snapshot()
	return pacingOf(arrivals, time.Second/peerRate), held, "", nil
}

// waitListen polls until addr accepts a connection.
func waitListen(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after %v", addr, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

type heldStats struct {
	peak    int64
	longest time.Duration
}

// nginxPacing starts nginx on a free port with limit_req at peerRate in
// delay mode (burst n, no nodelay) in front of the sink, sends n POSTs at
// once, and returns the pacing of their arrivals at the sink.
func (e *env) nginxPacing(ctx context.Context, bin string, sk *sink, n int) (pacing, heldStats, error) {
	dir := e.dir("nginx")
	addr, err := freeAddr()
	if err != nil {
		return pacing{}, heldStats{}, err
	}
	sinkHost := strings.TrimPrefix(strings.TrimSuffix(sk.URL, "/hook"), "http://")
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections %[2]d; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  limit_req_zone $server_port zone=lane:1m rate=%[3]dr/s;
  limit_req_status 503;
  upstream sink { server %[4]s; keepalive 64; }
  server {
    listen %[5]s;
    location / {
      limit_req zone=lane burst=%[6]d;
      proxy_pass http://sink/hook;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout 600s;
    }
  }
}
`, dir, 2*n+64, peerRate, sinkHost, addr, n)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return pacing{}, heldStats{}, err
	}
	cmd := exec.Command(bin, "-p", dir, "-c", confPath, "-e", filepath.Join(dir, "error.log"))
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return pacing{}, heldStats{}, fmt.Errorf("bench: nginx: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			return pacing{}, heldStats{}, fmt.Errorf("bench: nginx did not listen on %s: %s", addr, strings.TrimSpace(string(log)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	held, err := e.burstThrough(ctx, sk, "http://"+addr+"/", n)
	if err != nil {
		return pacing{}, heldStats{}, fmt.Errorf("bench: through nginx: %w", err)
	}
	arrivals, _ := sk.snapshot()
	return pacingOf(arrivals, time.Second/peerRate), held, nil
}

// burstThrough sends n POSTs of a job at once to url (a smoothing proxy in
// front of sk), waits for every answer and for n arrivals at sk, and says
// how many requests were held open at once and the longest.
func (e *env) burstThrough(ctx context.Context, sk *sink, url string, n int) (heldStats, error) {
	client := newClient(n)
	defer client.CloseIdleConnections()
	sk.reset(n)
	var (
		wg       sync.WaitGroup
		open     atomic.Int64
		peak     atomic.Int64
		mu       sync.Mutex
		longest  time.Duration
		firstErr error
	)
	rctx, cancel := context.WithTimeout(ctx, time.Duration(n)*time.Second/peerRate+30*time.Second)
	defer cancel()
	for range n {
		wg.Go(func() {
			o := open.Add(1)
			for p := peak.Load(); o > p && !peak.CompareAndSwap(p, o); p = peak.Load() {
			}
			t0 := time.Now()
			_, err := post(rctx, client, url, drainPayload, http.StatusOK)
			open.Add(-1)
			mu.Lock()
			defer mu.Unlock()
			longest = max(longest, time.Since(t0))
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return heldStats{}, firstErr
	}
	if err := sk.wait(ctx, n, time.Second, e.prog, "peer"); err != nil {
		return heldStats{}, err
	}
	return heldStats{peak: peak.Load(), longest: longest}, nil
}

// nginxVersion is what `nginx -v` says, or "".
func nginxVersion(bin string) string {
	out, err := exec.Command(bin, "-v").CombinedOutput()
	if err != nil && !errors.As(err, new(*exec.ExitError)) {
		return ""
	}
	v := strings.TrimSpace(string(out))
	v = strings.TrimPrefix(v, "nginx version: ")
	return v
}
