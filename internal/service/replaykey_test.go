package service_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestKeyedReplayWithoutKeyRefused: on a keyed lane, the dead letter of a
// job published on throttle.demo (no key) is not replayed as it is: one
// replay answers 409 replay-undeliverable naming key and saying why, a
// replay-all passes over it (counted, with its sequence) and replays the
// rest, and nothing of it is written. A replay with ?key= stores it on
// that key and it is delivered with that Throttle-Key; an invalid key is
// a 400 naming key. A job an earlier version's replay stranded on the
// lane's keyless subject is dead-lettered by the lane's key sweep.
func TestKeyedReplayWithoutKeyRefused(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	tgt := newKeyedTarget(t)
	fail := true
	tgt.answer = func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		if fail {
			w.WriteHeader(http.StatusBadRequest) // dead at once
			return true
		}
		return false
	}
	cfg := keyedConfig(t, tgt.srv.URL, 100, 10, 50, 1)
	cfg.NATS.URL = natsSrv.ClientURL()
	svc, _ := start(t, cfg)
	addr := svc.Addr()

	_, publish := natsPublisher(t, natsSrv.ClientURL())
	publish("throttle.demo", "no-key", "x", nil)
	if code := submitKeyed(t, http.DefaultClient, addr, "k", "refused"); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	page := waitDead(t, addr, "demo", "two dead letters", func(p api.DeadLetters) bool { return len(p.Dead) == 2 })
	seq := map[string]uint64{}
	for _, d := range page.Dead {
		seq[d.ID] = d.Seq
	}
	// Under the lock newKeyedTarget answers in.
	tgt.mu.Lock()
	fail = false
	tgt.mu.Unlock()

	replay := func(path string) (int, api.Problem, map[string]any) {
		t.Helper()
		code, body, _ := postTrace(t, addr, path, "", nil)
		var p api.Problem
		var out map[string]any
		if code >= 400 {
			_ = json.Unmarshal(body, &p)
		} else {
			_ = json.Unmarshal(body, &out)
		}
		return code, p, out
	}
	code, p, _ := replay(fmt.Sprintf("/v1/lanes/demo/dead/%d/replay", seq["no-key"]))
	if code != http.StatusConflict || p.Type != "urn:throttler:problem:replay-undeliverable" || p.Field != "key" ||
		!strings.Contains(p.Detail, "the job has no Throttle-Key; lane demo is keyed") || !strings.Contains(p.Detail, "?key=") {
		t.Fatalf("replay of no-key: %d %+v; want a 409 replay-undeliverable naming key, saying why and what to do", code, p)
	}
	code, p, _ = replay(fmt.Sprintf("/v1/lanes/demo/dead/%d/replay?key=a%%2Fb", seq["no-key"]))
	if code != http.StatusBadRequest || p.Type != "urn:throttler:problem:invalid-parameter" || p.Field != "key" {
		t.Fatalf("replay of no-key with key a/b: %d %+v; want a 400 naming key", code, p)
	}
	code, _, out := replay("/v1/lanes/demo/dead/replay")
	if code != http.StatusOK || out["replayed"] != 1.0 || out["undeliverable"] != 1.0 ||
		!slices.Equal(out["undeliverable_seqs"].([]any), []any{float64(seq["no-key"])}) {
		t.Fatalf("replay all: %d %v; want refused replayed, no-key passed over", code, out)
	}
	waitFor(t, 10*time.Second, "refused delivered", func() bool { return tgt.count("k") == 1 })
	page = waitDead(t, addr, "demo", "no-key alone", func(p api.DeadLetters) bool { return len(p.Dead) == 1 })
	if page.Dead[0].ID != "no-key" {
		t.Fatalf("dead letters %+v, want no-key alone", page.Dead)
	}

	code, _, out = replay(fmt.Sprintf("/v1/lanes/demo/dead/%d/replay?key=k2", seq["no-key"]))
	if code != http.StatusOK || out["id"] != "no-key" || out["key"] != "k2" {
		t.Fatalf("replay of no-key with key k2: %d %v", code, out)
	}
	waitFor(t, 10*time.Second, "no-key delivered on k2", func() bool { return tgt.count("k2") == 1 })
	if got := tgt.of("k2"); got[0].id != "no-key" {
		t.Fatalf("k2 got %+v, want no-key", got)
	}

	// An earlier version's replay stored a job on the keyless subject.
	publish(queue.InternalSubject("demo", ""), "", "x", nats.Header{queue.HeaderJobID: {"stranded"}})
	page = waitDead(t, addr, "demo", "the stranded job dead-lettered", func(p api.DeadLetters) bool { return len(p.Dead) == 1 })
	if d := page.Dead[0]; d.ID != "stranded" || !strings.Contains(d.Reason, "stored with no key") {
		t.Fatalf("dead letters %+v, want stranded, saying it had no key", page.Dead)
	}
	waitSettled(t, addr)
}
