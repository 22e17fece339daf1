package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const good = `
listen: 127.0.0.1:8080
lanes:
  - name: demo
    rate: 20
    burst: 10
    target:
      http:
        url: http://127.0.0.1:9000/hook
`

func TestExampleConfigLoads(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "configs", "throttler.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Lanes) == 0 || cfg.Lanes[0].Name != "demo" {
		t.Fatalf("lanes: %+v", cfg.Lanes)
	}
}

func TestDefaultsAndEnv(t *testing.T) {
	env := map[string]string{"THROTTLER_REDIS_URL": "redis://127.0.0.1:6379/0", "THROTTLER_LISTEN": "127.0.0.1:9999"}
	cfg, err := config.Parse("t.yaml", []byte(good), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.Lanes[0]
	if l.MaxInflight != config.DefaultMaxInflight || l.MaxBacklog != config.DefaultMaxBacklog || l.MaxBody != config.DefaultMaxBody ||
		l.Target.HTTP.Method != "POST" || l.Target.HTTP.Timeout.D() != config.DefaultTimeout {
		t.Fatalf("defaults not applied: %+v %+v", l, l.Target.HTTP)
	}
	if cfg.Redis.URL != env["THROTTLER_REDIS_URL"] || cfg.Listen != "127.0.0.1:9999" {
		t.Fatalf("env not applied: %+v", cfg)
	}
	if cfg.NATS.DedupWindow.D() != 2*time.Minute || cfg.ShutdownTimeout.D() != 15*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestErrorsNameFileAndField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"ZeroRate", strings.Replace(good, "rate: 20", "rate: 0", 1), "t.yaml: lanes[0].rate: must be a number greater than 0"},
		{"NegativeBurst", strings.Replace(good, "burst: 10", "burst: -1", 1), "t.yaml: lanes[0].burst:"},
		{"BadURL", strings.Replace(good, "http://127.0.0.1:9000/hook", "ftp://x", 1), "t.yaml: lanes[0].target.http.url:"},
		{"NoTarget", strings.Replace(good, "    target:\n      http:\n        url: http://127.0.0.1:9000/hook\n", "", 1), "t.yaml: lanes[0].target:"},
		{"BadName", strings.Replace(good, "name: demo", "name: a.b", 1), "t.yaml: lanes[0].name:"},
		{"Duplicate", good + strings.TrimPrefix(good[strings.Index(good, "  - name"):], ""), "t.yaml: lanes[1].name: \"demo\" is already the name of lanes[0]"},
		{"UnknownField", strings.Replace(good, "rate: 20", "rate: 20\n    rait: 3", 1), "t.yaml: line 6: field rait not found in a lane"},
		{"BadDuration", good + "shutdown_timeout: soon\n", "t.yaml: line 10: \"soon\" is not a duration"},
		{"BadNetwork", good + "dispatch:\n  allow_networks: [nope]\n", "t.yaml: dispatch.allow_networks[0]:"},
		{"BadRedis", good + "redis:\n  url: http://x\n", "t.yaml: redis.url:"},
		{"NoLanes", "listen: 127.0.0.1:1\n", "t.yaml: lanes: at least one lane is required"},
		{"BadLevel", good + "log:\n  level: loud\n", "t.yaml: log.level:"},
		{"TinyRate", strings.Replace(good, "rate: 20", "rate: 0.0000001", 1), "t.yaml: lanes[0].rate: must be between"},
		{"EndlessRefill", strings.Replace(good, "rate: 20\n    burst: 10", "rate: 0.00001\n    burst: 100000", 1), "t.yaml: lanes[0].burst: too large for the rate"},
		{"HugeBurst", strings.Replace(good, "burst: 10", "burst: 1000001", 1), "t.yaml: lanes[0].burst: must be between 1 and 1000000"},
		{"HugeRate", strings.Replace(good, "rate: 20", "rate: 1000001", 1), "t.yaml: lanes[0].rate: must be between"},
		{"BadHeaderName", strings.Replace(good, "        url: http://127.0.0.1:9000/hook", "        url: http://127.0.0.1:9000/hook\n        headers: {\"Bad Header\": x}", 1), "t.yaml: lanes[0].target.http.headers: \"Bad Header\" is not a valid header name"},
		{"BadSecret", withHTTP("signing_secrets: [whsec_!!!notbase64]"), "t.yaml: lanes[0].target.http.signing_secrets[0]: the part after whsec_ is not standard base64; expected whsec_ followed by the standard base64"},
		{"ShortSecret", withHTTP("signing_secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_c2hvcnQ=]"), "t.yaml: lanes[0].target.http.signing_secrets[1]: the key is 5 bytes; expected whsec_"},
		{"RawSecret", withHTTP("signing_secrets: [a-raw-secret-of-thirty-two-chars]"), "t.yaml: lanes[0].target.http.signing_secrets[0]: does not start with whsec_"},
		{"UnpaddedSecret", withHTTP("signing_secrets: [whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGA]"), "signing_secrets[0]: the part after whsec_ is not standard base64"},
		{"GoodSecrets", withHTTP("signing_secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGA==]"), ""},
		{"ReservedHeader", withHTTP("headers: {Idempotency-Key: x}"), `t.yaml: lanes[0].target.http.headers: "Idempotency-Key" is set by the target`},
		{"HeaderControl", withHTTP(`headers: {X-A: "a\u0001b"}`), `t.yaml: lanes[0].target.http.headers: value of "X-A" contains a control character`},
		{"NoHostname", strings.Replace(good, "http://127.0.0.1:9000/hook", "http://:9000/hook", 1), "t.yaml: lanes[0].target.http.url:"},
		{"WildcardInToken", strings.Replace(good, "      http:\n        url: http://127.0.0.1:9000/hook", "      nats: {subject: work.a*}", 1), "t.yaml: lanes[0].target.nats.subject:"},
		{"EmptySubjectToken", strings.Replace(good, "      http:\n        url: http://127.0.0.1:9000/hook", "      nats: {subject: a..b}", 1), "t.yaml: lanes[0].target.nats.subject:"},
		{"TwoTargets", strings.Replace(good, "      http:", "      nats: {subject: work}\n      http:", 1), "t.yaml: lanes[0].target: exactly one"},
		{"EmbeddedReplicas", good + "nats:\n  replicas: 3\n", "t.yaml: nats.replicas: the embedded server"},
		{"BadReplicas", good + "nats:\n  url: nats://x:4222\n  replicas: 2\n", "t.yaml: nats.replicas: must be 1, 3 or 5"},
		{"RetryTypo", strings.Replace(good, "burst: 10", "burst: 10\n    retry: {max_atempts: 3}", 1), "field max_atempts not found in a lane's retry"},
		{"TinyBody", strings.Replace(good, "burst: 10", "burst: 10\n    max_body: 0B", 1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse("t.yaml", []byte(tc.yaml), nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
			var ce *config.Error
			if !errors.As(err, &ce) || ce.File != "t.yaml" {
				t.Fatalf("error %T %v is not a *config.Error naming the file", err, err)
			}
		})
	}
}

// withHTTP adds a line to the target.http section of good.
func withHTTP(line string) string {
	return strings.Replace(good, "        url: http://127.0.0.1:9000/hook", "        url: http://127.0.0.1:9000/hook\n        "+line, 1)
}

func TestMissingFile(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}
