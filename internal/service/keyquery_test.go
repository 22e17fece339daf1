package service_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
)

// TestKeyURLQueryHiddenFromReaders: a key's url may carry its receiver's
// token in its query (https://hooks.example/in?token=…). GET of the key
// shows a read-only key the URL with its query as ?…; an admin key, which
// set it, sees it whole.
func TestKeyURLQueryHiddenFromReaders(t *testing.T) {
	t.Parallel()
	tgt := newKeyedTarget(t)
	cfg := keyedConfig(t, tgt.srv.URL, 200, 10, 10, 1)
	cfg.Lanes[0].Target.HTTP.JobURLs = []string{tgt.srv.URL + "/"}
	cfg.Auth.Keys = []config.Key{
		{ID: "ops", SHA256: hexSum("admin-secret"), Scopes: []string{"admin"}},
		{ID: "viewer", SHA256: hexSum("read-secret"), Scopes: []string{"read"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, _ := start(t, cfg)
	call := func(method, secret, body string) (int, api.KeyStatus, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+svc.Addr()+"/v1/lanes/demo/keys/cust-1", bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var st api.KeyStatus
		_ = json.Unmarshal(raw, &st)
		return resp.StatusCode, st, string(raw)
	}
	full := tgt.srv.URL + "/in?token=SECRET"
	if code, _, raw := call("PATCH", "admin-secret", `{"url":"`+full+`"}`); code != http.StatusOK {
		t.Fatalf("PATCH: %d %s", code, raw)
	}
	if code, st, raw := call("GET", "read-secret", ""); code != http.StatusOK || strings.Contains(raw, "SECRET") || st.URL != tgt.srv.URL+"/in?…" {
		t.Errorf("GET with a read key: %d %s, want the URL as %s/in?…", code, raw, tgt.srv.URL)
	}
	if code, st, raw := call("GET", "admin-secret", ""); code != http.StatusOK || st.URL != full {
		t.Errorf("GET with an admin key: %d %s, want the URL whole", code, raw)
	}
}
