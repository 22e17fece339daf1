package config_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/config"
)

func sum(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// writeFile writes content to a file name in a new temporary directory and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAccessErrorsNameTheField: every refusal of the auth, tls and http
// sections names its field, and a sha256 value is never quoted (it may be
// a secret put in the wrong place).
func TestAccessErrorsNameTheField(t *testing.T) {
	ops := sum("ops-secret")
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"KeysOK", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + ", scopes: [admin]}\n    - {id: shop, sha256: " + sum("s") + ", scopes: [\"submit:demo\"], plan: free}\n", ""},
		{"ShortSum", good + "auth:\n  keys:\n    - {id: ops, sha256: abc123, scopes: [admin]}\n", "t.yaml: auth.keys[0].sha256: must be the SHA-256 of the secret as 64 hex characters (got 6 characters)"},
		{"NotHex", good + "auth:\n  keys:\n    - {id: ops, sha256: " + strings.Repeat("g", 64) + ", scopes: [admin]}\n", "t.yaml: auth.keys[0].sha256:"},
		{"NoScopes", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + "}\n", "t.yaml: auth.keys[0].scopes: at least one scope"},
		{"BadScope", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + ", scopes: [write]}\n", "t.yaml: auth.keys[0].scopes[0]: \"write\" is not one of"},
		{"UnknownLane", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + ", scopes: [\"submit:nope\"]}\n", "t.yaml: auth.keys[0].scopes[0]: no lane named \"nope\""},
		{"ReadLane", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + ", scopes: [\"read:demo\"]}\n", "t.yaml: auth.keys[0].scopes[0]:"},
		{"DupID", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + ", scopes: [read]}\n    - {id: ops, sha256: " + ops + ", scopes: [read]}\n", "t.yaml: auth.keys[1].id: \"ops\" is already the id of auth.keys[0]"},
		{"BadPlan", good + "auth:\n  keys:\n    - {id: ops, sha256: " + ops + ", scopes: [read], plan: \"a b\"}\n", "t.yaml: auth.keys[0].plan:"},
		{"KeyTypo", good + "auth:\n  keys:\n    - {id: ops, sha: " + ops + ", scopes: [read]}\n", "field sha not found in a key"},
		{"OpenNonLoopback", withListen("0.0.0.0:8080"), "t.yaml: auth: listen 0.0.0.0:8080 is not a loopback address and no API keys are configured"},
		{"OpenAllInterfaces", withListen(":8080"), "t.yaml: auth: listen :8080"},
		{"AnonymousNonLoopback", withListen("0.0.0.0:8080") + "auth: {anonymous: true}\n", ""},
		{"KeysNonLoopback", withListen("0.0.0.0:8080") + "auth:\n  keys: [{id: ops, sha256: " + ops + ", scopes: [admin]}]\n", ""},
		{"AnonymousWithKeys", good + "auth:\n  anonymous: true\n  keys: [{id: ops, sha256: " + ops + ", scopes: [admin]}]\n", "t.yaml: auth.anonymous: cannot be true"},
		{"BadHost", good + "auth: {hosts: [\"http://x\"]}\n", "t.yaml: auth.hosts[0]:"},
		{"Hosts", good + "auth: {hosts: [api.example.com, \"api.example.com:8443\", \"[::1]:8080\"]}\n", ""},
		{"CertWithoutKey", good + "tls: {cert_file: c.pem}\n", "t.yaml: tls: cert_file and key_file go together"},
		{"CAWithoutCert", good + "tls: {client_ca_file: ca.pem}\n", "t.yaml: tls.client_ca_file:"},
		{"ZeroReadTimeout", good + "http: {read_timeout: 0s}\n", "t.yaml: http.read_timeout: must be greater than 0"},
		{"ZeroConnections", good + "http: {max_connections: 0}\n", "t.yaml: http.max_connections:"},
		{"InflightBelowBody", good + "http: {max_body_inflight: 512KiB}\n", "t.yaml: http.max_body_inflight: 524288 bytes is less than lanes[0].max_body"},
		{"PerIPNegative", good + "http: {max_connections_per_ip: -1}\n", "t.yaml: http.max_connections_per_ip: must be between 1 and http.max_connections (1024), got -1"},
		{"PerIPOverMax", good + "http: {max_connections: 10, max_connections_per_ip: 11}\n", "t.yaml: http.max_connections_per_ip: must be between 1 and http.max_connections (10), got 11"},
		{"PerIPAll", good + "http: {max_connections: 10, max_connections_per_ip: 10}\n", ""},
		{"IdleUnderLoadNegative", good + "http: {idle_timeout_under_load: -1s}\n", "t.yaml: http.idle_timeout_under_load: must not be negative"},
		{"IdleUnderLoadOverIdle", good + "http: {idle_timeout: 10s, idle_timeout_under_load: 11s}\n", "t.yaml: http.idle_timeout_under_load: 11s is longer than http.idle_timeout (10s)"},
		{"PerCallerNegative", good + "http: {max_body_inflight_per_caller: -1}\n", "t.yaml: http.max_body_inflight_per_caller: line 10: \"-1\" is not a size"},
		{"PerCallerOverInflight", good + "http: {max_body_inflight: 32MiB, max_body_inflight_per_caller: 33MiB}\n", "t.yaml: http.max_body_inflight_per_caller: 34603008 bytes is more than http.max_body_inflight (33554432)"},
		{"PerCallerBelowBatch", good + "http: {max_body_inflight_per_caller: 4MiB}\n", "t.yaml: http.max_body_inflight_per_caller: 4194304 bytes is less than the largest body one request may send (8388608"},
		{"PerCallerOK", good + "http: {max_body_inflight_per_caller: 8MiB}\n", ""},
		{"HTTPTypo", good + "http: {read_timout: 1s}\n", "field read_timout not found in http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseWants(t, tc.yaml, nil, tc.want)
			if err != nil && strings.Contains(err.Error(), ops) {
				t.Fatalf("error quotes a sha256 value: %v", err)
			}
		})
	}
}

func TestHTTPDefaults(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(good), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP != config.DefaultHTTP() || cfg.HTTP.MaxConnections != 1024 || cfg.HTTP.MaxBodyInflight != 64<<20 ||
		cfg.HTTP.ReadTimeout.D().Seconds() != 30 || cfg.HTTP.ReadHeaderTimeout.D().Seconds() != 10 {
		t.Fatalf("http defaults: %+v", cfg.HTTP)
	}
	// The derived bounds: an eighth of the connections per IP, a quarter
	// of the body budget per caller, 5s idle under load.
	if n, b, d := cfg.HTTP.ConnectionsPerIP(), cfg.BodyInflightPerCaller(), cfg.HTTP.IdleUnderLoad(); n != 128 || b != 16<<20 || d.Seconds() != 5 {
		t.Fatalf("derived http defaults: per IP %d, per caller %d, idle under load %s", n, b, d)
	}
	if cfg.HasKeys() || !cfg.LoopbackListen() {
		t.Fatalf("HasKeys %v LoopbackListen %v", cfg.HasKeys(), cfg.LoopbackListen())
	}
}

func TestKeysFile(t *testing.T) {
	ops := sum("ops-secret")
	withFile := func(path string) string {
		return good + "auth:\n  keys: [{id: ops, sha256: " + ops + ", scopes: [admin]}]\n  keys_file: " + path + "\n"
	}
	t.Run("Loads", func(t *testing.T) {
		path := writeFile(t, "keys.yaml", "- {id: shop, sha256: "+sum("shop")+", scopes: [\"submit:demo\"], plan: free}\n- id: ci\n  sha256: "+sum("ci")+"\n  scopes: [read]\n")
		cfg, err := config.Parse("t.yaml", []byte(withFile(path)), nil)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := cfg.LoadKeys()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 3 || keys[0].ID != "ops" || keys[1].ID != "shop" || keys[1].Plan != "free" || keys[2].ID != "ci" {
			t.Fatalf("keys %+v", keys)
		}
		if d := keys[1].Digest(); hex.EncodeToString(d[:]) != sum("shop") {
			t.Fatalf("digest %x", d)
		}
		if !cfg.HasKeys() {
			t.Fatal("HasKeys false")
		}
	})
	for _, tc := range []struct{ name, content, want string }{
		{"BadSum", "- {id: shop, sha256: nope, scopes: [read]}\n", "keys.yaml: [0].sha256: must be the SHA-256"},
		{"Empty", "[]\n", "keys.yaml: no keys"},
		{"EmptyFile", "", "keys.yaml: no keys"},
		{"Typo", "- {id: shop, sha256: " + sum("x") + ", scope: [read]}\n", "keys.yaml: line 1: field scope not found in a key"},
		{"DupWithInline", "- {id: ops, sha256: " + sum("x") + ", scopes: [read]}\n", "keys.yaml: [0].id: \"ops\" is already the id of auth.keys[0]"},
		{"UnknownLane", "- {id: shop, sha256: " + sum("x") + ", scopes: [\"submit:zzz\"]}\n", "keys.yaml: [0].scopes[0]: no lane named \"zzz\""},
		{"NotAList", "id: shop\n", "keys.yaml: line 1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "keys.yaml", tc.content)
			_, err := config.Parse("t.yaml", []byte(withFile(path)), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %v, want it to name %s and contain %q", err, path, tc.want)
			}
		})
	}
	t.Run("Missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "absent.yaml")
		_, err := config.Parse("t.yaml", []byte(withFile(path)), nil)
		if err == nil || !strings.Contains(err.Error(), "t.yaml: auth.keys_file: open "+path) || !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "no such file") {
			t.Fatalf("error %v", err)
		}
	})
}

// TestSecretsFromEnvAndFiles: every secret field takes the _env and _file
// forms; the value read replaces the field, a trailing newline dropped.
func TestSecretsFromEnvAndFiles(t *testing.T) {

	redisFile := writeFile(t, "redis-url", "redis://:s3cret-pw@redis:6379/0\n")
	tokenFile := writeFile(t, "token", "Bearer tok-123\r\n")
	whFile := writeFile(t, "wh", "whsec_dGhyb3R0bGVyLXRlc3Qtc2lnbmluZy1rZXktMDE=\n")
	opsFile := writeFile(t, "ops.sha256", sum("ops")+"\n")
	keysFile := writeFile(t, "keys.yaml", "- {id: ci, sha256_env: CI_SUM, scopes: [read]}\n")
	env := map[string]string{
		"NATS_URL": "nats://u:natspw@nats:4222",
		"WH2":      "whsec_c2Vjb25kLXNpZ25pbmcta2V5LTE2Yi14eHh4",
		"CI_SUM":   sum("ci"),
	}
	y := `
listen: 127.0.0.1:8080
nats:
  url_env: NATS_URL
redis:
  url_file: ` + redisFile + `
auth:
  keys:
    - {id: ops, sha256_file: ` + opsFile + `, scopes: [admin]}
  keys_file: ` + keysFile + `
lanes:
  - name: demo
    rate: 20
    target:
      http:
        url: http://127.0.0.1:9000/hook
        headers:
          Authorization_file: ` + tokenFile + `
          X-Plain: visible
        signing_secrets_file: [` + whFile + `]
  - name: other
    rate: 20
    target:
      http:
        url: http://127.0.0.1:9000/hook
        signing_secrets_env: WH2
`
	cfg, err := config.Parse("t.yaml", []byte(y), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	h, o := cfg.Lanes[0].Target.HTTP, cfg.Lanes[1].Target.HTTP
	if cfg.NATS.URL != env["NATS_URL"] || cfg.Redis.URL != "redis://:s3cret-pw@redis:6379/0" {
		t.Errorf("nats.url = %q, redis.url = %q", cfg.NATS.URL, cfg.Redis.URL)
	}
	if h.Headers["Authorization"] != "Bearer tok-123" || h.Headers["X-Plain"] != "visible" || len(h.Headers) != 2 {
		t.Errorf("headers = %q", h.Headers)
	}
	if len(h.SigningSecrets) != 1 || h.SigningSecrets[0] != "whsec_dGhyb3R0bGVyLXRlc3Qtc2lnbmluZy1rZXktMDE=" ||
		len(o.SigningSecrets) != 1 || o.SigningSecrets[0] != env["WH2"] {
		t.Errorf("signing_secrets = %q, %q", h.SigningSecrets, o.SigningSecrets)
	}
	keys, err := cfg.LoadKeys()
	if err != nil {
		t.Fatal(err)
	}
	if keys[0].SHA256 != sum("ops") || keys[1].SHA256 != sum("ci") {
		t.Fatalf("keys %+v", keys)
	}
}

// TestSecretErrorsNameFieldAndFile: a missing variable or file, an empty
// file, or two forms of one field are refused naming the field (and the
// file), without the secret; _env on a field that is not a secret is an
// unknown field.
func TestSecretErrorsNameFieldAndFile(t *testing.T) {
	empty := writeFile(t, "empty", "\n")
	absent := filepath.Join(t.TempDir(), "absent")
	env := map[string]string{"SET": "redis://:pw-in-env@r:6379"}
	for _, tc := range []struct{ name, yaml, want string }{
		{"UnsetEnv", good + "redis: {url_env: UNSET}\n", "t.yaml: redis.url_env: environment variable UNSET is not set or empty"},
		{"MissingFile", good + "nats: {url_file: " + absent + "}\n", "t.yaml: nats.url_file: open " + absent + ": no such file"},
		{"EmptyFile", good + "redis: {url_file: " + empty + "}\n", "t.yaml: redis.url_file: " + empty + " is empty"},
		{"TwoForms", good + "redis: {url: \"redis://x:6379\", url_env: SET}\n", "t.yaml: redis.url_env: give only one of url, url_env and url_file"},
		{"HeaderTwoForms", withHTTP("headers: {Authorization: x, Authorization_env: SET}"), "t.yaml: lanes[0].target.http.headers.Authorization_env: give only one of"},
		{"NotASecret", good + "log: {level_env: SET}\n", "t.yaml: line 10: field level_env not found in log"},
		{"ListenEnv", "listen_env: SET\n" + good, "field listen_env not found at the top level"},
		{"KeyEnvUnset", good + "auth:\n  keys: [{id: a, sha256_env: NOPE, scopes: [read]}]\n", "t.yaml: auth.keys[0].sha256_env: environment variable NOPE"},
		{"UnknownFieldNextToResolved", good + "redis: {url_env: SET}\nredis2: 1\n", "field redis2 not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parseWants(t, tc.yaml, func(k string) string { return env[k] }, tc.want)
			if strings.Contains(err.Error(), "pw-in-env") {
				t.Fatalf("error shows the secret: %v", err)
			}
		})
	}
}

// TestBadRedisURLIsRedacted: the error refusing redis.url does not show
// its password.
func TestBadRedisURLIsRedacted(t *testing.T) {
	_, err := config.Parse("t.yaml", []byte(good+"redis: {url: \"http://user:hunter2-pw@redis:6379/0?password=qs-secret\"}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "redis.url") || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "qs-secret") {
		t.Fatalf("error %v", err)
	}
	if !strings.Contains(err.Error(), "user:***@redis:6379/0?password=***") {
		t.Fatalf("error %v does not show the redacted URL", err)
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://redis:6379/0", "redis://redis:6379/0"},
		{"redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"},
		{"redis://user:pw@redis:6379/0", "redis://user:***@redis:6379/0"},
		{"nats://token@nats:4222", "nats://***@nats:4222"},
		{"nats://a:p1@n1:4222,nats://b:p2@n2:4222", "nats://a:***@n1:4222,nats://b:***@n2:4222"},
		{"redis://s1:26379/0?master_name=m&addr=s2:26379&password=x", "redis://s1:26379/0?master_name=***&addr=***&password=***"},
		{"redis://u:p@ss/w?rd@h:1/0", "redis://u:***@h:1/0"},
		{"https://h/p?api_key=k#frag", "https://h/p?api_key=***"},
		{"https://h/p?%zz=1", "https://h/p?***"},
		{"", ""},
	} {
		if got := config.RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestScrubURL(t *testing.T) {
	raw := "redis://user:hunter2%40pw@r:6379/0?password=qs-secret&addr=r2:6379"
	msg := `parse "` + raw + `": bad; again hunter2%40pw and hunter2@pw and qs-secret; dial r2:6379`
	got := config.ScrubURL(msg, raw)
	for _, bad := range []string{"hunter2", "qs-secret"} {
		if strings.Contains(got, bad) {
			t.Errorf("ScrubURL left %q: %s", bad, got)
		}
	}
	if !strings.Contains(got, "dial r2:6379") || !strings.Contains(got, "redis://user:***@r:6379/0?password=***&addr=***") {
		t.Errorf("ScrubURL = %s", got)
	}
}
