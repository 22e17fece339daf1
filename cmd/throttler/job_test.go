package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestCLIJob runs `throttler job` as a real process against a real server
// with job records: a delivered job's record, an unknown id (exit 3), a
// cancel of a delivered job (409 job-started) and of a delayed one; and
// the help text names the exit code a refused cancel really has.
func TestCLIJob(t *testing.T) {
	t.Parallel()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	t.Cleanup(ok.Close)
	url := serveEmbedded(t, fmt.Sprintf(`lanes:
  - name: demo
    max_bytes: 64MiB
    rate: 50/s
    burst: 5
    results: {keep: 1h}
    target: {http: {url: %s, timeout: 5s}}
`, ok.URL))
	env := []string{"THROTTLER_SERVER=" + url, "THROTTLER_KEY="}
	submit := func(id string, hdr ...string) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/v1/lanes/demo/jobs", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", id)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit %s: %s", id, resp.Status)
		}
	}

	submit("j1")
	code, out, errOut := cli(t, env, "job", "demo", "j1", "--wait")
	want(t, "job --wait", code, out, errOut, 0, "delivered", "")
	code, out, errOut = cli(t, env, "job", "demo", "nope")
	want(t, "job of an unknown id", code, out, errOut, 3, "", "404")
	refused, out, errOut := cli(t, env, "job", "cancel", "demo", "j1")
	want(t, "job cancel of a delivered job", refused, out, errOut, 2, "", "409")

	submit("d1", "Throttle-Delay", "1h")
	code, out, errOut = cli(t, env, "job", "cancel", "demo", "d1")
	want(t, "job cancel of a delayed job", code, out, errOut, 0, "cancelled", "")

	// The help says what a refused cancel exits with: the code it has.
	_, out, errOut = cli(t, env, "job", "--help")
	m := regexp.MustCompile(`\(exit (\d), 409`).FindStringSubmatch(out + errOut)
	if m == nil {
		t.Fatalf("job --help names no exit code for a refused cancel:\n%s%s", out, errOut)
	}
	if n, _ := strconv.Atoi(m[1]); n != refused {
		t.Fatalf("job --help says a refused cancel exits %d; it exits %d", n, refused)
	}
}
