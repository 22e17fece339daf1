package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// TestDeadListingHidesQueries: the query of a job's Throttle-Path or
// Throttle-URL may hold a credential (?api_key=…), as the attempt's error
// knows (it never quotes one). The dead-letter listing, which a read-only
// key sees, shows a job's path and URL without their query; GET of one
// dead letter, admin only, shows it whole for a replay.
func TestDeadListingHidesQueries(t *testing.T) {
	t.Parallel()
	a := newAPITarget(t)
	a.dead["q-path"], a.dead["q-url"] = true, true
	svc, _ := start(t, destConfig(t, a, 200, 50))
	addr := svc.Addr()
	for id, h := range map[string]map[string]string{
		"q-path": {"Throttle-Path": "issues/1?api_key=SECRET-1&x=y"},
		"q-url":  {"Throttle-URL": a.srv.URL + "/v2/hooks/9?token=SECRET-2"},
	} {
		h["Idempotency-Key"] = id
		if code, body, _ := postTrace(t, addr, "/v1/lanes/api/jobs", "x", h); code != http.StatusAccepted {
			t.Fatalf("%s: %d %s", id, code, body)
		}
	}
	var raw []byte
	var page api.DeadLetters
	testenv.Eventually(t, 10*time.Second, "two dead letters", func() bool {
		resp, err := pollClient.Get("http://" + addr + "/v1/lanes/api/dead")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		raw, _ = io.ReadAll(resp.Body)
		page = api.DeadLetters{}
		return json.Unmarshal(raw, &page) == nil && len(page.Dead) == 2
	})
	if strings.Contains(string(raw), "SECRET") {
		t.Errorf("the listing shows a query: %s", raw)
	}
	var seq uint64
	for _, d := range page.Dead {
		switch d.ID {
		case "q-path":
			seq = d.Seq
			if d.Path != "issues/1?…" {
				t.Errorf("listed path %q, want issues/1?…", d.Path)
			}
		case "q-url":
			if want := a.srv.URL + "/v2/hooks/9?…"; d.URL != want {
				t.Errorf("listed URL %q, want %q", d.URL, want)
			}
		}
	}
	resp, err := pollClient.Get(fmt.Sprintf("http://%s/v1/lanes/api/dead/%d", addr, seq))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var one api.DeadLetter
	_ = json.NewDecoder(resp.Body).Decode(&one)
	if one.Path != "issues/1?api_key=SECRET-1&x=y" {
		t.Errorf("GET of the dead letter: path %q, want it whole", one.Path)
	}
}
