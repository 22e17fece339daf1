package config_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
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

// parseWants parses yaml as the file t.yaml, with env as the environment.
// With want empty the file must load; otherwise it must be refused with a
// *config.Error naming the file, whose text contains want. It returns that
// error for further checks (nil when the file loads).
func parseWants(t *testing.T, yaml string, env func(string) string, want string) error {
	t.Helper()
	_, err := config.Parse("t.yaml", []byte(yaml), env)
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error %v", err)
		}
		return nil
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want it to contain %q", err, want)
	}
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "t.yaml" {
		t.Fatalf("error %T %v is not a *config.Error naming the file", err, err)
	}
	return err
}

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
		{"BadDuration", good + "shutdown_timeout: soon\n", "t.yaml: shutdown_timeout: line 10: \"soon\" is not a duration"},
		{"BadLaneDuration", withLane("retry: {backoff_max: 1d}"), `t.yaml: lanes[0].retry.backoff_max: line 7: "1d" is not a duration`},
		{"HugeSize", withLane("max_bytes: 17179869184GiB"), `t.yaml: lanes[0].max_bytes: line 7: "17179869184GiB" is too large`},
		{"HugerSize", good + "dead_letters:\n  max_bytes: 99999999999999999999\n", `t.yaml: dead_letters.max_bytes: line 11: "99999999999999999999" is too large`},
		{"NegativeSize", withLane("max_body: -1"), `t.yaml: lanes[0].max_body: line 7: "-1" is not a size`},
		{"SignedSize", withLane("max_body: +1KiB"), `t.yaml: lanes[0].max_body: line 7: "+1KiB" is not a size`},
		{"LargestSize", good + "dead_letters:\n  max_bytes: 8589934591GiB\n", ""},
		{"SecondDocument", good + "---\nlisten: 127.0.0.1:1\n", "t.yaml: line 10: a second YAML document (after ---) is not allowed"},
		{"EmptySecondDocument", good + "---\n", "a second YAML document"},
		{"LeadingDocumentMarker", "---\n" + good, ""},
		{"BadSecondDocument", good + "---\n[\n", "a second YAML document"},
		{"ListenNoPort", withListen("127.0.0.1"), `t.yaml: listen: "127.0.0.1" is not host:port`},
		{"ListenBigPort", withListen("127.0.0.1:65536"), `t.yaml: listen: port 65536 of "127.0.0.1:65536" is out of range`},
		{"ListenNamedPort", withListen("\"127.0.0.1:http\""), `t.yaml: listen: port "http" of "127.0.0.1:http" is not a number`},
		{"ListenSignedPort", withListen("\"127.0.0.1:+80\""), `t.yaml: listen: port "+80" of "127.0.0.1:+80" is not a number`},
		{"ListenEmptyPort", withListen("\"127.0.0.1:\""), `t.yaml: listen: port "" of "127.0.0.1:" is not a number`},
		{"ListenHostName", withListen("example.com:8080"), `t.yaml: listen: host "example.com" of "example.com:8080" is not an IP address or localhost`},
		{"ListenBadColon", withListen("\":abc\""), `t.yaml: listen: port "abc"`},
		{"ListenLocalhost", withListen("localhost:8080"), ""},
		{"ListenAnyHost", withListen("\":8080\"") + "auth: {anonymous: true}\n", ""},
		{"ListenIPv6", withListen("\"[::1]:8080\""), ""},
		{"ListenFreePort", withListen("127.0.0.1:0"), ""},
		{"NATSListenNoHost", good + "nats:\n  listen: \":4222\"\n", `t.yaml: nats.listen: ":4222" has no host`},
		{"NATSListenPort0", good + "nats:\n  listen: 127.0.0.1:0\n", `t.yaml: nats.listen: port 0`},
		{"NATSListenBigPort", good + "nats:\n  listen: 127.0.0.1:99999\n", `t.yaml: nats.listen: port 99999 of "127.0.0.1:99999" is out of range`},
		{"NATSListenName", good + "nats:\n  listen: nats:4222\n", `t.yaml: nats.listen: host "nats" of "nats:4222" is not an IP address or localhost`},
		{"NATSListenLocalhost", good + "nats:\n  listen: localhost:4222\n", ""},
		{"ReservedDead", strings.Replace(good, "name: demo", "name: DEAD", 1), `t.yaml: lanes[0].name: "DEAD" is reserved: its stream would be THROTTLE_DEAD`},
		{"ReservedRetry", strings.Replace(good, "name: demo", "name: retry", 1), `t.yaml: lanes[0].name: "retry" is reserved: its stream would be THROTTLE_RETRY`},
		{"NotReserved", strings.Replace(good, "name: demo", "name: dead-letters", 1), ""},
		{"AckWaitNegative", withLane("ack_wait: -1s"), "t.yaml: lanes[0].ack_wait: must be greater than 0"},
		{"BadNetwork", good + "dispatch:\n  allow_networks: [nope]\n", "t.yaml: dispatch.allow_networks[0]:"},
		{"BadRedis", good + "redis:\n  url: http://x\n", "t.yaml: redis.url:"},
		{"NoLanes", "listen: 127.0.0.1:1\n", "t.yaml: lanes: at least one lane is required"},
		{"BadLevel", good + "log:\n  level: loud\n", "t.yaml: log.level:"},
		{"TinyRate", strings.Replace(good, "rate: 20", "rate: 1/20d", 1), "t.yaml: lanes[0].rate: must be between"},
		{"RateDigits", strings.Replace(good, "rate: 20", "rate: 0.0000001", 1), `t.yaml: lanes[0].rate: line 5: "0.0000001" is not a rate: the count has more than 6 decimal places; write a rate like 20/s`},
		{"RateUnit", strings.Replace(good, "rate: 20", "rate: 20/w", 1), `t.yaml: lanes[0].rate: line 5: "20/w" is not a rate: unknown unit "w"`},
		{"RateSecondLane", good + "  - {name: two, rate: 20/fortnight, target: {nats: {subject: w}}}\n", `t.yaml: lanes[1].rate: line 10: "20/fortnight" is not a rate`},
		{"RateNotScalar", strings.Replace(good, "rate: 20", "rate: [20]", 1), "t.yaml: line 5: cannot unmarshal"},
		{"RateWithQuota", strings.Replace(good, "burst: 10", "quota: {limit: 1000, per: 1h}", 1), "t.yaml: lanes[0].quota: is given with rate or burst: give either quota, or rate and burst"},
		{"BurstWithQuota", strings.Replace(good, "rate: 20", "quota: {limit: 1000, per: 1h}", 1), "t.yaml: lanes[0].quota: is given with rate or burst"},
		{"QuotaNoRoom", withQuota("{limit: 2, per: 1s}"), "t.yaml: lanes[0].quota.limit: 2 with burst 1 leaves no room for a steady rate"},
		{"QuotaBurstOverLimit", withQuota("{limit: 20, per: 1s, burst: 30}"), "t.yaml: lanes[0].quota.burst: must be from 1 to the limit 20, got 30"},
		{"QuotaNoLimit", withQuota("{per: 1s}"), "t.yaml: lanes[0].quota.limit: must be from 1"},
		{"QuotaNoPer", withQuota("{limit: 100}"), "t.yaml: lanes[0].quota.per: must be a whole number of seconds"},
		{"QuotaFractionalPer", withQuota("{limit: 100, per: 1500ms}"), "t.yaml: lanes[0].quota.per: must be a whole number of seconds from 1s to 366 days, got 1.5s"},
		{"QuotaBadPer", withQuota("{limit: 100, per: 1d}"), `t.yaml: lanes[0].quota.per: line 5: "1d" is not a duration`},
		{"QuotaTypo", withQuota("{limit: 100, per: 1h, brust: 5}"), "t.yaml: line 5: field brust not found in a lane's quota"},
		{"QuotaTooSlow", withQuota("{limit: 3, per: 8784h}"), "t.yaml: lanes[0].quota: derives rate 1/366d and burst 1, which cannot be used"},
		{"Quota", withQuota("{limit: 1000, per: 1h, burst: 50}"), ""},
		{"EndlessRefill", strings.Replace(good, "rate: 20\n    burst: 10", "rate: 0.00001\n    burst: 100000", 1), "t.yaml: lanes[0].burst: too large for the rate"},
		{"HugeBurst", strings.Replace(good, "burst: 10", "burst: 1000001", 1), "t.yaml: lanes[0].burst: must be between 1 and 1000000"},
		{"HugeRate", strings.Replace(good, "rate: 20", "rate: 1000001", 1), "t.yaml: lanes[0].rate: must be between"},
		{"BadHeaderName", withHTTP("headers: {\"Bad Header\": x}"), "t.yaml: lanes[0].target.http.headers: \"Bad Header\" is not a valid header name"},
		{"BadSecret", withHTTP("signing_secrets: [whsec_!!!notbase64]"), "t.yaml: lanes[0].target.http.signing_secrets[0]: the part after whsec_ is not standard base64; expected whsec_ followed by the standard base64"},
		{"ShortSecret", withHTTP("signing_secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_c2hvcnQ=]"), "t.yaml: lanes[0].target.http.signing_secrets[1]: the key is 5 bytes; expected whsec_"},
		{"RawSecret", withHTTP("signing_secrets: [a-raw-secret-of-thirty-two-chars]"), "t.yaml: lanes[0].target.http.signing_secrets[0]: does not start with whsec_"},
		{"UnpaddedSecret", withHTTP("signing_secrets: [whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGA]"), "signing_secrets[0]: the part after whsec_ is not standard base64"},
		{"GoodSecrets", withHTTP("signing_secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGA==]"), ""},
		{"ReservedHeader", withHTTP("headers: {Idempotency-Key: x}"), `t.yaml: lanes[0].target.http.headers: "Idempotency-Key" is set by the target`},
		{"HeaderControl", withHTTP(`headers: {X-A: "a\u0001b"}`), `t.yaml: lanes[0].target.http.headers: value of "X-A" contains a control character`},
		{"NoHostname", strings.Replace(good, "http://127.0.0.1:9000/hook", "http://:9000/hook", 1), "t.yaml: lanes[0].target.http.url:"},
		{"WildcardInToken", withNATS("{subject: work.a*}"), "t.yaml: lanes[0].target.nats.subject:"},
		{"EmptySubjectToken", withNATS("{subject: a..b}"), "t.yaml: lanes[0].target.nats.subject:"},
		{"TwoTargets", strings.Replace(good, "      http:", "      nats: {subject: work}\n      http:", 1), "t.yaml: lanes[0].target: exactly one"},
		{"HandlerNotInFiles", strings.Replace(good, "      http:\n        url: http://127.0.0.1:9000/hook", "      handler: mine", 1), "field handler not found"},
		{"WorkersOK", withNATS("{subject: work, mode: pull}") + "nats:\n  user: t\n  password: p\n  workers: [{user: w-1, password: q, lanes: [demo]}]\n", ""},
		{"WorkersNeedPullLane", good + "nats:\n  user: t\n  password: p\n  workers: [{user: w-1, password: q}]\n", "t.yaml: nats.workers[0]: no lane has target.nats.mode pull"},
		{"WorkerUserName", withNATS("{subject: work, mode: pull}") + "nats:\n  user: t\n  password: p\n  workers: [{user: w.1, password: q}]\n", `t.yaml: nats.workers[0].user: "w.1" must be 1-64 letters`},
		{"WorkerLaneNotPull", withNATS("{subject: work, mode: pull}") + "nats:\n  user: t\n  password: p\n  workers: [{user: w, password: q, lanes: [nope]}]\n", `t.yaml: nats.workers[0].lanes[0]: no pull-mode lane "nope"`},
		{"WorkersExternalNoPassword", withNATS("{subject: work, mode: pull}") + "nats:\n  url: nats://x:4222\n  workers: [{user: w, password: q}]\n", "t.yaml: nats.workers[0].password: is for the embedded server"},
		{"WorkersExternalNames", withNATS("{subject: work, mode: pull}") + "nats:\n  url: nats://x:4222\n  workers: [{user: w, lanes: [demo]}]\n  pull_login: {user: tp, password: x}\n", ""},
		{"PullLoginEmbedded", withNATS("{subject: work, mode: pull}") + "nats:\n  user: t\n  password: p\n  pull_login: {user: tp, password: x}\n", "t.yaml: nats.pull_login: is for an external server"},
		{"PullLoginHalf", withNATS("{subject: work, mode: pull}") + "nats:\n  url: nats://x:4222\n  pull_login: {user: tp}\n", "t.yaml: nats.pull_login.password: user and password go together"},
		{"PullLoginTwo", withNATS("{subject: work, mode: pull}") + "nats:\n  url: nats://x:4222\n  pull_login: {user: tp, password: x, creds_file: /c}\n", "t.yaml: nats.pull_login.creds_file: give one of"},
		{"PullUserReserved", withNATS("{subject: work, mode: pull}") + "nats:\n  user: t\n  password: p\n  workers: [{user: throttler-pull, password: q}]\n", `t.yaml: nats.workers[0].user: "throttler-pull" is already a user`},
		{"PublisherUserName", good + "nats:\n  user: t\n  password: p\n  publishers: [{user: shop.eu, password: q}]\n", `t.yaml: nats.publishers[0].user: "shop.eu" must be 1-64 letters`},
		{"PullMode", withNATS("{subject: work, mode: pull, lease: 1m}"), ""},
		{"BadMode", withNATS("{subject: work, mode: push}"), `t.yaml: lanes[0].target.nats.mode: "push" is not one of request, pull`},
		{"PullJetStream", withNATS("{subject: work, mode: pull, jetstream: true}"), "t.yaml: lanes[0].target.nats.mode: pull cannot be combined with jetstream"},
		{"LeaseInRequestMode", withNATS("{subject: work, lease: 5s}"), "t.yaml: lanes[0].target.nats.lease: applies to mode pull only"},
		{"PullSubjectShared", withNATS("{subject: work, mode: pull}") + "  - {name: two, rate: 1, target: {nats: {subject: work}}}\n", `t.yaml: lanes[1].target.nats.subject: "work" is the pull-mode work subject of lanes[0]`},
		{"KeyedOK", withLane("per_key: {rate: 5/s, burst: 2, max_inflight: 4, ordered: true}"), ""},
		{"KeyedNoRate", withLane("per_key: {burst: 2}"), "t.yaml: lanes[0].per_key.rate: is required"},
		{"KeyedInflightOverLane", withLane("max_inflight: 4\n    per_key: {rate: 5/s, max_inflight: 5}"), "t.yaml: lanes[0].per_key.max_inflight: must be between 1 and the lane's max_inflight (4)"},
		{"KeyedAdaptive", withLane("per_key: {rate: 5/s, adaptive: {enabled: true}}"), ""},
		// per_key.key_from: url_host needs an http target with job_urls,
		// and every job_urls host must make a valid key.
		{"KeyFromURLHost", withKeyFrom("url_host", `job_urls: ["https://a.example.com/in", "http://B.example.net:8080/"]`), ""},
		{"KeyFromUnknown", withKeyFrom("host", `job_urls: ["https://a.example.com/"]`), `t.yaml: lanes[0].per_key.key_from: "host" is not one of url_host`},
		{"KeyFromNoJobURLs", withKeyFrom("url_host", ""), "t.yaml: lanes[0].per_key.key_from: url_host takes a job's key from the host of its URL: the lane needs an http target that lists target.http.job_urls"},
		{"KeyFromNATS", strings.Replace(withNATS("{subject: work}"), "burst: 10", "burst: 10\n    per_key: {rate: 5/s, key_from: url_host}", 1), "t.yaml: lanes[0].per_key.key_from: url_host takes"},
		{"KeyFromIPv6", withKeyFrom("url_host", `job_urls: ["https://a.example.com/", "http://[::1]:9000/"]`), "t.yaml: lanes[0].target.http.job_urls[1]: its host cannot be a key (per_key.key_from: url_host): the key has a byte 0x5b at 0"},
		{"KeyFromLongHost", withKeyFrom("url_host", `job_urls: ["https://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.example.com:8443/"]`), "t.yaml: lanes[0].target.http.job_urls[0]: its host cannot be a key (per_key.key_from: url_host): the key is 138 bytes; at most 128"},
		{"KeyedAdaptiveBad", withLane("per_key: {rate: 5/s, adaptive: {enabled: true, min: 2}}"), "t.yaml: lanes[0].per_key.adaptive.min: must be in (0, 1], got 2"},
		{"EmbeddedReplicas", good + "nats:\n  replicas: 3\n", "t.yaml: nats.replicas: the embedded server"},
		{"BadReplicas", good + "nats:\n  url: nats://x:4222\n  replicas: 2\n", "t.yaml: nats.replicas: must be 1, 3 or 5"},
		{"RetryTypo", withLane("retry: {max_atempts: 3}"), "field max_atempts not found in a lane's retry"},
		{"TinyBody", withLane("max_body: 0B"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) { parseWants(t, tc.yaml, nil, tc.want) })
	}
}

// withQuota replaces good's rate and burst with a quota.
func withQuota(q string) string {
	return strings.Replace(good, "rate: 20\n    burst: 10", "quota: "+q, 1)
}

// withListen sets listen in good.
func withListen(v string) string {
	return strings.Replace(good, "listen: 127.0.0.1:8080", "listen: "+v, 1)
}

// withLane adds a line to good's lane, after its burst.
func withLane(line string) string {
	return strings.Replace(good, "burst: 10", "burst: 10\n    "+line, 1)
}

// withKeyFrom makes good's lane keyed with per_key.key_from set to from,
// and adds line (job_urls) to its http target.
func withKeyFrom(from, line string) string {
	return strings.Replace(withHTTP(line), "burst: 10", "burst: 10\n    per_key: {rate: 5/s, key_from: "+from+"}", 1)
}

// withNATS replaces good's http target with target.nats set to v.
func withNATS(v string) string {
	return strings.Replace(good, "      http:\n        url: http://127.0.0.1:9000/hook", "      nats: "+v, 1)
}

// withHTTP adds a line to the target.http section of good.
func withHTTP(line string) string {
	return strings.Replace(good, "        url: http://127.0.0.1:9000/hook", "        url: http://127.0.0.1:9000/hook\n        "+line, 1)
}

func TestOwnSubjectsRefused(t *testing.T) {
	for _, subject := range []string{
		"throttle", "throttle.demo", "throttle.other.x", "throttler.control.demo", "throttle_retry.demo",
		"throttle_dead.demo", "$JS.API.STREAM.LIST", "$KV.bucket.key", "$SYS.REQ.SERVER.PING", "_INBOX.abc",
	} {
		yaml := withNATS("{subject: " + subject + "}")
		_, err := config.Parse("t.yaml", []byte(yaml), nil)
		if err == nil || !strings.Contains(err.Error(), "t.yaml: lanes[0].target.nats.subject: \""+subject+"\" is in ") {
			t.Errorf("subject %s: err = %v, want it refused naming the field", subject, err)
		}
	}
	for _, subject := range []string{"throttlers.x", "work.throttle", "throttler", "_INBOXES.x", "JS.API", "throttle-x.y", "$JSX.a"} {
		yaml := withNATS("{subject: " + subject + "}")
		if _, err := config.Parse("t.yaml", []byte(yaml), nil); err != nil {
			t.Errorf("subject %s: %v", subject, err)
		}
	}
}

// TestReservedNamesMatchQueue: the names config keeps back are the ones
// whose stream is a shared stream of package queue, and the subject spaces
// it refuses hold the queue's subjects.
func TestReservedNamesMatchQueue(t *testing.T) {
	for _, name := range []string{"DEAD", "RETRY"} {
		yaml := strings.Replace(good, "name: demo", "name: "+name, 1)
		_, err := config.Parse("t.yaml", []byte(yaml), nil)
		if err == nil || !strings.Contains(err.Error(), "is reserved") {
			t.Errorf("lane %s: err = %v", name, err)
		}
	}
	if s := queue.StreamName("DEAD"); s != queue.DeadStream {
		t.Errorf("lane DEAD has stream %s, not the dead-letter stream %s: update reservedLaneName", s, queue.DeadStream)
	}
	if s := queue.StreamName("RETRY"); s != queue.RetryStream {
		t.Errorf("lane RETRY has stream %s, not the retry stream %s: update reservedLaneName", s, queue.RetryStream)
	}
	for _, prefix := range []string{queue.SubjectPrefix, queue.RetrySubjectPrefix, queue.DeadSubjectPrefix} {
		yaml := withNATS("{subject: " + prefix + ".demo}")
		if _, err := config.Parse("t.yaml", []byte(yaml), nil); err == nil {
			t.Errorf("subject %s.demo accepted: update ownSubjects", prefix)
		}
	}
}

func TestRateForms(t *testing.T) {
	for in, want := range map[string]float64{
		"20": 20, "0.5": 0.5, "20/s": 20, "120/min": 2, "5/m": 5.0 / 60, "1000/h": 1000.0 / 3600,
		"2/d": 2.0 / 86400, `"20 / s"`: 20, "900/15min": 1, "1e3": 1000, `"0.25"`: 0.25,
	} {
		cfg, err := config.Parse("t.yaml", []byte(strings.Replace(good, "rate: 20", "rate: "+in, 1)), nil)
		if err != nil {
			t.Errorf("rate: %s: %v", in, err)
			continue
		}
		if got := cfg.Lanes[0].Rate.PerSecond(); math.Abs(got-want) > 1e-12*want {
			t.Errorf("rate: %s is %v/s, want %v/s", in, got, want)
		}
	}
}

// TestQuotaDerivesRateAndBurst: a quota gives the lane rate
// (limit - burst - 1)/per and the quota's burst, and stays on the lane as
// written for display.
func TestQuotaDerivesRateAndBurst(t *testing.T) {
	for _, tc := range []struct {
		quota string
		rate  string
		burst int
	}{
		{"{limit: 1000, per: 1h, burst: 50}", "949/h", 50},
		{"{limit: 1000, per: 1h}", "998/h", 1},
		{"{limit: 900, per: 15m, burst: 10}", "889/15min", 10},
		{"{limit: 10, per: 1s}", "8/s", 1},
	} {
		cfg, err := config.Parse("t.yaml", []byte(withQuota(tc.quota)), nil)
		if err != nil {
			t.Errorf("quota %s: %v", tc.quota, err)
			continue
		}
		l := cfg.Lanes[0]
		if l.Rate.String() != tc.rate || l.Burst != tc.burst {
			t.Errorf("quota %s: rate %s burst %d, want %s burst %d", tc.quota, l.Rate, l.Burst, tc.rate, tc.burst)
		}
		if l.Quota == nil || l.Quota.Burst != tc.burst || l.Quota.Limit < 1 || l.Quota.Per <= 0 {
			t.Errorf("quota %s: kept as %+v", tc.quota, l.Quota)
		}
		// A config that loaded validates again, unchanged by defaults.
		again := cfg
		again.ApplyDefaults()
		if err := again.Validate(); err != nil || again.Lanes[0].Rate != l.Rate || again.Lanes[0].Burst != l.Burst {
			t.Errorf("quota %s: revalidated to %s burst %d: %v", tc.quota, again.Lanes[0].Rate, again.Lanes[0].Burst, err)
		}
	}
}

func TestAckWaitDefault(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(good), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Lanes[0].AckWait.D(); got != config.DefaultAckWait {
		t.Errorf("ack_wait = %v, want the default %v", got, config.DefaultAckWait)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}
