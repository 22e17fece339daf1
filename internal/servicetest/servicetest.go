// Package servicetest runs the throttler service inside a test and reads
// its metrics: one way for every package's tests (service, worker, deploy,
// cmd/throttler, fleet) to start an instance, wait for it to serve and stop
// it with the test, and one way to scrape /metrics (or gather a registry)
// and read a series from it.
//
// It is test support: no production package imports it (layout_test.go).
// Every function that takes a testing.TB fails the test on an error
// instead of returning it; all are safe for concurrent use.
package servicetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/testenv"
)

// ReadyTimeout bounds how long an instance may take to serve.
const ReadyTimeout = 20 * time.Second

// Client bounds every request of the helpers (and of the tests that use
// it), so that a server that stops answering fails the test instead of
// hanging it until -timeout.
var Client = &http.Client{Timeout: 5 * time.Second}

// Start runs service.New(cfg, a logger writing to t.Output(), reg) with
// Run; see there. reg may be nil (the service then makes its own).
func Start(t testing.TB, cfg config.Config, reg *prometheus.Registry) (*service.Service, func()) {
	t.Helper()
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), reg)
	return svc, Run(t, svc)
}

// Run runs svc until stop is called or the test ends, and returns once svc
// serves (Ready). It fails t when svc exits before that or is not ready in
// ReadyTimeout, and when its Run returns an error. stop cancels svc and
// waits for its Run to return; calling it again does nothing.
func Run(t testing.TB, svc *service.Service) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("servicetest: Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-svc.Ready():
	case err := <-errc:
		errc <- err // for stop
		t.Fatalf("servicetest: the service did not start: %v", err)
	case <-time.After(ReadyTimeout):
		t.Fatalf("servicetest: the service is not ready after %v", ReadyTimeout)
	}
	return stop
}

// WaitSettled waits until every lane at addr holds nothing: no job stored
// (waiting or in flight) and none waiting for a retry (GET /v1/lanes).
// Nothing is left then that could be delivered later, so a count taken
// after it is final: the proof that no stray or duplicate delivery comes,
// without sleeping to see none.
func WaitSettled(t testing.TB, within time.Duration, addr string) {
	t.Helper()
	testenv.EventuallyNil(t, within, "the lanes at "+addr+" to settle", func() error {
		resp, err := Client.Get("http://" + addr + "/v1/lanes")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var l api.Lanes
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			return fmt.Errorf("GET /v1/lanes: %d: %w", resp.StatusCode, err)
		}
		if len(l.Lanes) == 0 {
			return errors.New("GET /v1/lanes lists no lane")
		}
		for _, ln := range l.Lanes {
			if ln.Backlog != 0 || ln.Retrying != 0 || ln.InFlight != 0 {
				return fmt.Errorf("lane %s: backlog %d, retrying %d, in flight %d", ln.Name, ln.Backlog, ln.Retrying, ln.InFlight)
			}
		}
		return nil
	})
}

// Series is one scrape or gather: every sample by its series, written as
// the text format writes it: name{label="value",…} with the labels sorted
// by name, the bare name when it has none; a histogram as its _bucket,
// _sum and _count series.
type Series map[string]float64

// Get returns the value of one series and whether it is there.
func (s Series) Get(series string) (float64, bool) {
	v, ok := s[series]
	return v, ok
}

// Sum adds up the series of the family name (all its label sets) and says
// whether there was any.
func (s Series) Sum(name string) (float64, bool) {
	sum, found := 0.0, false
	for k, v := range s {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// Grep lists the series whose text holds sub with their values, one a
// line, sorted: what a failure message quotes.
func (s Series) Grep(sub string) string {
	var out []string
	for k, v := range s {
		if strings.Contains(k, sub) {
			out = append(out, k+" "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// ParseText reads the Prometheus text format.
func ParseText(text []byte) (Series, error) {
	out := Series{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// name{labels} value, the labels' values quoted (a space or a
		// brace may be in them): the value follows the last space.
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("servicetest: metrics line %q has no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("servicetest: metrics line %q: %w", line, err)
		}
		out[strings.TrimSpace(line[:i])] = v
	}
	return out, sc.Err()
}

// TryScrape reads http://addr/metrics (with "Authorization: Bearer
// secret" unless secret is "") in the text format: the series and the
// body as served. For polls that wait for an instance to answer; Scrape
// fails the test instead.
func TryScrape(addr, secret string) (Series, string, error) {
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, "", err
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := Client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("servicetest: read /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, string(body), fmt.Errorf("servicetest: /metrics answered %d: %.200s", resp.StatusCode, body)
	}
	s, err := ParseText(body)
	return s, string(body), err
}

// Scrape is TryScrape that fails t on an error.
func Scrape(t testing.TB, addr, secret string) (Series, string) {
	t.Helper()
	s, body, err := TryScrape(addr, secret)
	if err != nil {
		t.Fatalf("servicetest: scrape %s: %v", addr, err)
	}
	return s, body
}

// Gather reads reg as a scrape would (the same series).
func Gather(t testing.TB, reg prometheus.Gatherer) Series {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("servicetest: gather: %v", err)
	}
	var buf bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&buf, f); err != nil {
			t.Fatalf("servicetest: gather %s: %v", f.GetName(), err)
		}
	}
	s, err := ParseText(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Any is a want of WaitFor: any value above 0.
const Any = -1

// WaitFor reads series with read until every want holds (the value, or
// with Any any value above 0) and returns the last read; it fails t with
// the series that do not hold after within (testenv.EventuallyNil).
func WaitFor(t testing.TB, within time.Duration, read func() Series, want map[string]float64) Series {
	t.Helper()
	var got Series
	testenv.EventuallyNil(t, within, "the metrics", func() error {
		got = read()
		if miss := missing(got, want); len(miss) > 0 {
			return errors.New("\n" + strings.Join(miss, "\n"))
		}
		return nil
	})
	return got
}

func missing(got Series, want map[string]float64) []string {
	var miss []string
	for k, v := range want {
		g, ok := got[k]
		if !ok || (v != Any && g != v) || (v == Any && g <= 0) {
			miss = append(miss, fmt.Sprintf("%s = %v (present %v), want %v", k, g, ok, v))
		}
	}
	slices.Sort(miss)
	return miss
}

// ErrNoSeries is what Value returns for a series that is not there.
var ErrNoSeries = errors.New("servicetest: no such series")

// Value scrapes addr and returns one series (ErrNoSeries when absent): for
// polls on another process's metrics.
func Value(addr, series string) (float64, error) {
	s, _, err := TryScrape(addr, "")
	if err != nil {
		return 0, err
	}
	v, ok := s[series]
	if !ok {
		return 0, fmt.Errorf("%w: %s at %s", ErrNoSeries, series, addr)
	}
	return v, nil
}
