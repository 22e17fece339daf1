package lane

import (
	"testing"

	"github.com/throttler/throttler/internal/config"
)

// TestTargetConfigCarriesMaxInflight: an HTTP target learns its lane's
// max_inflight, so that it keeps that many connections warm.
func TestTargetConfigCarriesMaxInflight(t *testing.T) {
	tc := targetConfig(config.Target{HTTP: &config.HTTPTarget{URL: "http://127.0.0.1:1/hook"}}, 1000, nil)
	if tc.HTTP == nil || tc.HTTP.MaxInflight != 1000 {
		t.Fatalf("HTTP target config %+v, want MaxInflight 1000", tc.HTTP)
	}
}
