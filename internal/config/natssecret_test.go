package config_test

import (
	"testing"

	"github.com/throttler/throttler/internal/config"
)

// TestNATSPasswordsFromEnvAndFiles: the throttler's NATS password and the
// publishers' come from the environment or a file like every secret.
func TestNATSPasswordsFromEnvAndFiles(t *testing.T) {
	pw := writeFile(t, "pw", "hunter2\n")
	y := `nats: {data_dir: ./d, user: throttler, password_env: NATS_PW, publishers: [{user: shop, password_file: ` + pw + `}]}
lanes: [{name: demo, rate: 5/s, target: {http: {url: "http://127.0.0.1:9/x"}}}]
`
	cfg, err := config.Parse("n.yaml", []byte(y), func(k string) string {
		if k == "NATS_PW" {
			return "s3cret"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.Password != "s3cret" || cfg.NATS.Publishers[0].Password != "hunter2" {
		t.Fatalf("passwords %q, %q", cfg.NATS.Password, cfg.NATS.Publishers[0].Password)
	}
}
