package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// sink is the local target: an HTTP server on 127.0.0.1 that records when
// each job arrives, and, for a body that starts with "t=<unix ns>", how long
// after that stamp it arrived. Safe for concurrent use.
type sink struct {
	URL string
	srv *http.Server

	mu       sync.Mutex
	arrivals []time.Time
	lat      []time.Duration
	count    atomic.Int64
	// firstOf is each Throttle-Key's first arrival (keyed lanes).
	firstOf map[string]time.Time
}

func startSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: sink: %w", err)
	}
	s := &sink{URL: "http://" + ln.Addr().String() + "/hook"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// stampPrefix starts a body that carries its send time.
const stampPrefix = "t="

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	var buf [64]byte
	n, _ := io.ReadFull(r.Body, buf[:])
	_, _ = io.Copy(io.Discard, r.Body)
	var lat time.Duration = -1
	if b := buf[:n]; bytes.HasPrefix(b, []byte(stampPrefix)) {
		b = b[len(stampPrefix):]
		if i := bytes.IndexFunc(b, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			b = b[:i]
		}
		if ns, err := strconv.ParseInt(string(b), 10, 64); err == nil {
			lat = now.Sub(time.Unix(0, ns))
		}
	}
	key := r.Header.Get("Throttle-Key")
	s.mu.Lock()
	s.arrivals = append(s.arrivals, now)
	if _, seen := s.firstOf[key]; key != "" && !seen {
		if s.firstOf == nil {
			s.firstOf = map[string]time.Time{}
		}
		s.firstOf[key] = now
	}
	if lat >= 0 {
		s.lat = append(s.lat, lat)
	}
	s.mu.Unlock()
	s.count.Add(1)
	w.WriteHeader(http.StatusOK)
}

// reset forgets every arrival; expect sizes the buffers.
func (s *sink) reset(expect int) {
	s.mu.Lock()
	s.arrivals = make([]time.Time, 0, expect)
	s.lat = make([]time.Duration, 0, expect)
	s.firstOf = nil
	s.count.Store(0)
	s.mu.Unlock()
}

// snapshot returns copies of the arrivals and latencies recorded so far.
func (s *sink) snapshot() ([]time.Time, []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.arrivals...), append([]time.Duration(nil), s.lat...)
}

// wait polls until n jobs arrived, ctx ends or timeout passes.
func (s *sink) wait(ctx context.Context, n int, timeout time.Duration, p *progress, phase string) error {
	deadline := time.Now().Add(timeout)
	for {
		got := int(s.count.Load())
		p.set(phase, got, n)
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s: %d of %d jobs arrived within %v", phase, got, n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// first returns when the first job with Throttle-Key key arrived.
func (s *sink) first(key string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.firstOf[key]
	return t, ok
}

func (s *sink) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// newClient is an HTTP client with exactly conns keep-alive connections per
// host. It only ever talks to the loopback servers of the run.
func newClient(conns int) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			MaxConnsPerHost:     conns,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
	}
}

// post sends body to url and returns the response body (first 512 bytes)
// when the status is want.
func post(ctx context.Context, c *http.Client, url string, body []byte, want int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != want {
		return b, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return b, nil
}

// loadResult is what a closed or open loop measured.
type loadResult struct {
	OK, Failed int
	Elapsed    time.Duration
	Lat        latencies
	Err        error // the first failure
	// CPU is the CPU time of the whole process (load, service, embedded
	// NATS) during the loop, when the caller measured it; 0: not measured.
	CPU time.Duration
}

// CPUPerOp is CPU per successful operation, 0 when not measured.
func (r loadResult) CPUPerOp() time.Duration {
	if r.OK == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.OK)
}

// Rate is successful operations per second.
func (r loadResult) Rate() float64 { return rate(r.OK, r.Elapsed) }

// closedLoop runs op on workers goroutines back to back until d has passed
// or maxOps operations were started, and measures each call.
func closedLoop(ctx context.Context, workers int, d time.Duration, maxOps int, p *progress, phase string,
	op func(ctx context.Context, worker, i int) error) loadResult {
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second) // a stuck call cannot hold the loop
	defer cancel()
	var (
		started atomic.Int64
		mu      sync.Mutex
		res     loadResult
		all     []time.Duration
		wg      sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	stopTick := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopTick:
				return
			case <-t.C:
				p.set(phase, int(time.Since(start)/time.Millisecond), int(d/time.Millisecond))
			}
		}
	}()
	for w := range workers {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1024)
			ok, failed := 0, 0
			var first error
			for i := 0; ; i++ {
				if started.Add(1) > int64(maxOps) || ctx.Err() != nil {
					break
				}
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				if err := op(ctx, w, i); err != nil {
					failed++
					if first == nil {
						first = err
					}
					continue
				}
				ok++
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			res.OK += ok
			res.Failed += failed
			if res.Err == nil {
				res.Err = first
			}
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(stopTick)
	res.Elapsed = time.Since(start)
	res.Lat = summarise(all)
	return res
}

// openLoop starts op(i) for i in [0, n) at rate per second on a pool of
// workers, whether or not earlier calls have finished, until n calls or the
// deadline. It returns how many calls failed and the first error.
func openLoop(ctx context.Context, perSecond float64, n, workers int, timeout time.Duration, p *progress, phase string,
	op func(ctx context.Context, i int) error) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	jobs := make(chan int, workers*4)
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
		mu     sync.Mutex
		first  error
	)
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				if err := op(ctx, i); err != nil {
					failed.Add(1)
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	period := time.Duration(float64(time.Second) / perSecond)
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
loop:
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * period)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				break loop
			}
		}
		select {
		case jobs <- i:
		case <-ctx.Done():
			break loop
		}
		if i%64 == 0 {
			p.set(phase, i, n)
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil && first == nil && errors.Is(err, context.DeadlineExceeded) {
		first = fmt.Errorf("bench: %s: not all %d calls made within %v", phase, n, timeout)
	}
	return int(failed.Load()), first
}
