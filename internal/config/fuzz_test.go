package config_test

import (
	"net/netip"
	"testing"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
)

// FuzzParse feeds arbitrary bytes to the loader. It never panics; what it
// refuses is a *config.Error naming the file; and what it accepts validates
// again, keeps its values through ApplyDefaults, and starts: every lane's
// limit, HTTP target, signer and NATS subject is accepted by the code that
// uses it (a file that loads is a file that starts).
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := config.Parse("f.yaml", raw, nil)
		if err != nil {
			if ce, ok := err.(*config.Error); !ok || ce.File != "f.yaml" {
				t.Fatalf("error %T %v is not a *config.Error naming the file", err, err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted, then Validate: %v", err)
		}
		again := cfg
		again.Lanes = append([]config.Lane(nil), cfg.Lanes...)
		again.ApplyDefaults()
		if err := again.Validate(); err != nil {
			t.Fatalf("accepted, then ApplyDefaults and Validate: %v", err)
		}
		for _, n := range cfg.Dispatch.AllowNetworks {
			if _, err := netip.ParsePrefix(n); err != nil {
				t.Fatalf("allow_networks %q accepted: %v", n, err)
			}
		}
		for i, l := range cfg.Lanes {
			if again.Lanes[i].Rate != l.Rate || again.Lanes[i].Burst != l.Burst || again.Lanes[i].AckWait != l.AckWait {
				t.Fatalf("lanes[%d]: ApplyDefaults changed a loaded lane", i)
			}
			if err := (bucket.Limit{Rate: l.Rate.PerSecond(), Burst: l.Burst}).Validate(); err != nil {
				t.Fatalf("lanes[%d]: limit accepted, refused by bucket: %v", i, err)
			}
			if h := l.Target.HTTP; h != nil {
				tgt, err := dispatch.NewHTTP(dispatch.HTTPConfig{URL: h.URL, Method: h.Method, Headers: h.Headers, Timeout: h.Timeout.D(), RetryOther4xx: h.RetryOther4xx}, nil)
				if err != nil {
					t.Fatalf("lanes[%d]: HTTP target accepted, refused by dispatch: %v", i, err)
				}
				tgt.Close()
				if len(h.SigningSecrets) > 0 {
					if _, err := dispatch.NewSigner(h.SigningSecrets, nil); err != nil {
						t.Fatalf("lanes[%d]: signing secrets accepted, refused by dispatch: %v", i, err)
					}
				}
			}
			if n := l.Target.NATS; n != nil {
				if err := (dispatch.NATSConfig{Subject: n.Subject, Timeout: n.Timeout.D(), JetStream: n.JetStream}).Validate(); err != nil {
					t.Fatalf("lanes[%d]: NATS target accepted, refused by dispatch: %v", i, err)
				}
			}
		}
	})
}
