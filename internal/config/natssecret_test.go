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

// TestPullLoginPasswordFromEnv: nats.pull_login.password is a secret like
// the others, and worker names without passwords go with nats.url.
func TestPullLoginPasswordFromEnv(t *testing.T) {
	y := `nats: {url: "nats://127.0.0.1:4222", pull_login: {user: throttler-pull, password_env: PULL_PW}, workers: [{user: render-1, lanes: [r]}]}
lanes: [{name: r, rate: 5/s, target: {nats: {subject: r.work, mode: pull}}}]
`
	cfg, err := config.Parse("n.yaml", []byte(y), func(k string) string {
		if k == "PULL_PW" {
			return "s3cret"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.PullLogin.Password != "s3cret" || len(cfg.NATS.WorkersOf("r")) != 1 {
		t.Fatalf("pull login %+v, workers of r %v", cfg.NATS.PullLogin, cfg.NATS.WorkersOf("r"))
	}
}
