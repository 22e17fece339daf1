package dispatch

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/dest"
)

// TestKeyHeadersStayWithTheKeysReceiver: a key's headers are its
// receiver's credentials. They go with the key's jobs to the key's URL
// (and to a job URL of the same origin), never to a job's own Throttle-URL
// on another origin, which a submitter chooses.
func TestKeyHeadersStayWithTheKeysReceiver(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[string]string{} // path -> X-Api-Key received
	record := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.Host+r.URL.Path] = r.Header.Get("X-Api-Key")
		mu.Unlock()
	}
	keySrv, other := serve(t, record), serve(t, record)
	h := newHTTP(t, HTTPConfig{URL: keySrv.URL + "/base", Timeout: 5 * time.Second, ForwardHeaders: []string{"X-Api-Key"},
		JobURLs: []string{keySrv.URL + "/", other.URL + "/"}}, nil)
	keyURL, _ := url.Parse(keySrv.URL + "/in")
	kt := &KeyTarget{URL: keyURL, Header: http.Header{"X-Api-Key": {"key-secret"}}}
	for _, tc := range []struct {
		name string
		d    dest.Request
		at   string
		want string
	}{
		{"the key's URL", dest.Request{}, keySrv.Listener.Addr().String() + "/in", "key-secret"},
		{"a path under it", dest.Request{Path: "a"}, keySrv.Listener.Addr().String() + "/in/a", "key-secret"},
		{"a job URL of the key's origin", dest.Request{URL: keySrv.URL + "/elsewhere"}, keySrv.Listener.Addr().String() + "/elsewhere", "key-secret"},
		{"a job URL of another origin", dest.Request{URL: other.URL + "/x"}, other.Listener.Addr().String() + "/x", ""},
		{"another origin, the job's own header", dest.Request{URL: other.URL + "/y", Headers: map[string]string{"X-Api-Key": "job's"}}, other.Listener.Addr().String() + "/y", "job's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := testJob()
			job.Key, job.KeyTarget, job.Dest = "k", kt, tc.d
			if res := h.Deliver(context.Background(), job); res.Verdict != Done {
				t.Fatalf("delivery: %v %v", res.Verdict, res.Err)
			}
			mu.Lock()
			defer mu.Unlock()
			v, ok := got[tc.at]
			if !ok {
				t.Fatalf("nothing arrived at %s: %v", tc.at, got)
			}
			if v != tc.want {
				t.Errorf("X-Api-Key at %s: %q, want %q", tc.at, v, tc.want)
			}
		})
	}
}
