package service_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestEmbeddedMemoryWarning: an instance on the embedded server whose lanes'
// bounds allow more than config.EmbeddedMemoryWarn of de-duplication index
// says so at start, with what to set; one default lane stays quiet.
func TestEmbeddedMemoryWarning(t *testing.T) {
	t.Parallel()
	const warning = "embedded nats: the lanes' bounds allow more memory"
	t.Run("one lane", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:9/hook", 20, 10)
		_, logs := startLogged(t, cfg)
		if strings.Contains(logs.String(), warning) {
			t.Fatalf("warned for one default lane:\n%s", logs)
		}
	})
	t.Run("seven lanes", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:9/hook", 20, 10)
		for i := 1; i < 7; i++ {
			l := cfg.Lanes[0]
			l.Name = fmt.Sprintf("demo%d", i)
			cfg.Lanes = append(cfg.Lanes, l)
		}
		_, logs := startLogged(t, cfg)
		out := logs.String()
		for _, want := range []string{warning, `"estimate_mb":253`, `"dedup_ids":733740`, "nats.dedup_window", "nats.url"} {
			if !strings.Contains(out, want) {
				t.Errorf("start log lacks %q:\n%s", want, out)
			}
		}
	})
}
