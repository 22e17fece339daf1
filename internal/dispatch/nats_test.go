package dispatch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/testenv"
)

// connect starts an in-process nats-server and returns a connection that
// is closed (before the server stops) when the test ends.
func connect(t *testing.T) *nats.Conn {
	t.Helper()
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newNATS(t *testing.T, nc *nats.Conn, cfg NATSConfig) *NATS {
	t.Helper()
	n, err := NewNATS(nc, cfg)
	if err != nil {
		t.Fatalf("NewNATS: %v", err)
	}
	return n
}

// workerPool runs n queue-group workers on subject. A worker answers with
// the status named in the payload ("done", "retry", "dead", "silent" for
// no header, anything else as is); it records the request headers and
// which worker served it.
type workerPool struct {
	mu      sync.Mutex
	served  map[int]int
	headers []nats.Header
	data    [][]byte
}

func startWorkers(t *testing.T, nc *nats.Conn, subject string, n int) *workerPool {
	t.Helper()
	p := &workerPool{served: map[int]int{}}
	for i := range n {
		sub, err := nc.QueueSubscribe(subject, "workers", func(m *nats.Msg) {
			p.mu.Lock()
			p.served[i]++
			p.headers = append(p.headers, m.Header)
			p.data = append(p.data, m.Data)
			p.mu.Unlock()
			reply := nats.NewMsg(m.Reply)
			switch status := string(m.Data); status {
			case "silent":
			case "retry":
				reply.Header.Set(HeaderStatus, "retry")
				reply.Header.Set(HeaderRetryAfter, "3")
				reply.Header.Set(HeaderError, "downstream busy")
			case "dead":
				reply.Header.Set(HeaderStatus, "DEAD")
				reply.Header.Set(HeaderError, "malformed job")
			default:
				reply.Header.Set(HeaderStatus, status)
			}
			if err := m.RespondMsg(reply); err != nil {
				t.Errorf("worker %d: respond: %v", i, err)
			}
		})
		if err != nil {
			t.Fatalf("QueueSubscribe: %v", err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNATSRequestReply(t *testing.T) {
	nc := connect(t)
	pool := startWorkers(t, nc, "work.email", 4)
	n := newNATS(t, nc, NATSConfig{Subject: "work.email", Timeout: 2 * time.Second})

	steps := []struct {
		payload    string
		verdict    Verdict
		retryAfter time.Duration
		errIs      error
		errHas     string
	}{
		{"done", Done, 0, nil, ""},
		{"silent", Done, 0, nil, ""},
		{"retry", Retry, 3 * time.Second, ErrWorker, "downstream busy"},
		{"dead", Dead, 0, ErrWorker, "malformed job"},
		{"bogus", Retry, 0, nil, `unknown Throttler-Status "bogus"`},
	}
	for _, s := range steps {
		t.Run(s.payload, func(t *testing.T) {
			job := Job{ID: "id-" + s.payload, Lane: "email", Key: "cust-7", Payload: []byte(s.payload), Attempt: 3}
			res := n.Deliver(context.Background(), job)
			if res.Verdict != s.verdict || res.RetryAfter != s.retryAfter {
				t.Fatalf("verdict %v RetryAfter %v, want %v %v (err %v)", res.Verdict, res.RetryAfter, s.verdict, s.retryAfter, res.Err)
			}
			if s.errIs != nil && !errors.Is(res.Err, s.errIs) {
				t.Errorf("err = %v, want %v", res.Err, s.errIs)
			}
			switch {
			case s.errHas == "" && res.Err != nil:
				t.Errorf("err = %v, want nil", res.Err)
			case s.errHas != "" && (res.Err == nil || !strings.Contains(res.Err.Error(), s.errHas)):
				t.Errorf("err = %v, want it to contain %q", res.Err, s.errHas)
			}
			if res.Status != 0 || res.Took <= 0 {
				t.Errorf("Status %d Took %v", res.Status, res.Took)
			}
		})
	}

	pool.mu.Lock()
	h, data := pool.headers[0], pool.data[0]
	pool.mu.Unlock()
	checks := []struct{ name, got, want string }{
		{"payload", string(data), "done"},
		{"Idempotency-Key", h.Get("Idempotency-Key"), "id-done"},
		{"Content-Type", h.Get("Content-Type"), DefaultContentType},
		{"Throttler-Lane", h.Get("Throttler-Lane"), "email"},
		{"Throttler-Key", h.Get("Throttler-Key"), "cust-7"},
		{"Throttler-Attempt", h.Get("Throttler-Attempt"), "3"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestNATSWorkerPool: concurrent deliveries are spread over the queue
// group, and each is answered exactly once.
func TestNATSWorkerPool(t *testing.T) {
	nc := connect(t)
	pool := startWorkers(t, nc, "work.pool", 4)
	n := newNATS(t, nc, NATSConfig{Subject: "work.pool", Timeout: 5 * time.Second})
	const jobs = 200
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Go(func() {
			res := n.Deliver(context.Background(), Job{ID: itoa(int64(i)), Lane: "pool", ContentType: "text/plain", Payload: []byte("done")})
			if res.Verdict != Done {
				t.Errorf("job %d: %v %v", i, res.Verdict, res.Err)
			}
		})
	}
	wg.Wait()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	total := 0
	for _, c := range pool.served {
		total += c
	}
	if total != jobs {
		t.Errorf("workers served %d requests, want %d", total, jobs)
	}
	if len(pool.served) < 2 {
		t.Errorf("only %d of 4 workers served requests: %v", len(pool.served), pool.served)
	}
	if ct := pool.headers[0].Get("Content-Type"); ct != "text/plain" {
		t.Errorf("Content-Type = %q", ct)
	}
}

func TestNATSNoResponders(t *testing.T) {
	nc := connect(t)
	n := newNATS(t, nc, NATSConfig{Subject: "work.nobody", Timeout: 5 * time.Second})
	res := n.Deliver(context.Background(), Job{ID: "x", Payload: []byte("p")})
	if res.Verdict != Retry || !errors.Is(res.Err, nats.ErrNoResponders) {
		t.Fatalf("verdict %v err %v, want retry with ErrNoResponders", res.Verdict, res.Err)
	}
	if res.Took > time.Second {
		t.Errorf("Took = %v: no responders should answer at once", res.Took)
	}
}

func TestNATSTimeout(t *testing.T) {
	nc := connect(t)
	sub, err := nc.Subscribe("work.slow", func(*nats.Msg) {}) // never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	const timeout = 200 * time.Millisecond
	res := newNATS(t, nc, NATSConfig{Subject: "work.slow", Timeout: timeout}).Deliver(context.Background(), Job{ID: "x"})
	if res.Verdict != Retry || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Fatalf("verdict %v err %v, want retry with a timeout", res.Verdict, res.Err)
	}
	if res.Took < timeout || res.Took > timeout+time.Second {
		t.Errorf("Took = %v, want ≈ %v", res.Took, timeout)
	}
}

func TestNATSMaxPayloadIsDead(t *testing.T) {
	nc := connect(t)
	startWorkers(t, nc, "work.big", 1)
	big := make([]byte, nc.MaxPayload()+1)
	res := newNATS(t, nc, NATSConfig{Subject: "work.big"}).Deliver(context.Background(), Job{ID: "x", Payload: big})
	if res.Verdict != Dead || !errors.Is(res.Err, nats.ErrMaxPayload) {
		t.Errorf("verdict %v err %v, want dead with ErrMaxPayload", res.Verdict, res.Err)
	}
}

func TestNATSJetStream(t *testing.T) {
	nc := connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       "WORK",
		Subjects:   []string{"work.js.>"},
		Duplicates: time.Minute,
	})
	if err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	n := newNATS(t, nc, NATSConfig{Subject: "work.js.orders", JetStream: true, Timeout: 5 * time.Second})
	job := Job{ID: "order-1", Lane: "orders", ContentType: "application/json", Payload: []byte(`{"o":1}`), Attempt: 1}
	for i := range 2 { // the second is a duplicate: acked, not stored
		if res := n.Deliver(ctx, job); res.Verdict != Done || res.Err != nil {
			t.Fatalf("publish %d: %v %v", i, res.Verdict, res.Err)
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1 (dedup by Nats-Msg-Id)", info.State.Msgs)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, "work.js.orders")
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != `{"o":1}` || msg.Header.Get(jetstream.MsgIDHeader) != "order-1" ||
		msg.Header.Get("Idempotency-Key") != "order-1" || msg.Header.Get(HeaderLane) != "orders" {
		t.Errorf("stored message: data %q headers %v", msg.Data, msg.Header)
	}

	// No stream bound to the subject: Retry.
	n2 := newNATS(t, nc, NATSConfig{Subject: "unbound.subject", JetStream: true, Timeout: 2 * time.Second})
	if res := n2.Deliver(ctx, job); res.Verdict != Retry || res.Err == nil {
		t.Errorf("unbound subject: verdict %v err %v, want retry", res.Verdict, res.Err)
	}
}

func TestValidSubject(t *testing.T) {
	for _, s := range []string{"a", "work.email", "$JS.API.x", "a-b_c.d~e", "ünïcode.ok"} {
		if !ValidSubject(s) {
			t.Errorf("ValidSubject(%q) = false", s)
		}
	}
	for _, s := range []string{"", ".", "a.", ".a", "a..b", "a b", "a\tb", "a\nb", "a\x00b", "a\x7fb", "*", "a.*", ">", "a.>", "a.b*", "a>b"} {
		if ValidSubject(s) {
			t.Errorf("ValidSubject(%q) = true", s)
		}
	}
}

func TestNewNATSValidation(t *testing.T) {
	nc := connect(t)
	if _, err := NewNATS(nil, NATSConfig{Subject: "a"}); err == nil {
		t.Error("nil connection accepted")
	}
	steps := []struct {
		cfg  NATSConfig
		want string
	}{
		{NATSConfig{}, "Subject: required"},
		{NATSConfig{Subject: "a.*"}, "Subject:"},
		{NATSConfig{Subject: "a.>"}, "Subject:"},
		{NATSConfig{Subject: "a..b"}, "Subject:"},
		{NATSConfig{Subject: "a b"}, "Subject:"},
		{NATSConfig{Subject: "a", Timeout: -1}, "Timeout:"},
		{NATSConfig{Subject: "a.b*"}, "Subject:"},
	}
	for _, s := range steps {
		if _, err := NewNATS(nc, s.cfg); err == nil || !strings.Contains(err.Error(), s.want) {
			t.Errorf("NewNATS(%+v) = %v, want it to contain %q", s.cfg, err, s.want)
		}
	}
}

// TestNATSTargetValidationIsShared: the request and the pull target check
// their subject and duration with one rule, each naming its own field.
func TestNATSTargetValidationIsShared(t *testing.T) {
	steps := []struct {
		name string
		err  error
		want string
	}{
		{"request empty", NATSConfig{}.Validate(), "dispatch: nats: Subject: required"},
		{"pull empty", PullConfig{}.Validate(), "dispatch: pull: Subject: required"},
		{"request wildcard", NATSConfig{Subject: "a.>"}.Validate(), `dispatch: nats: Subject: "a.>" is not a literal subject`},
		{"pull wildcard", PullConfig{Subject: "a.*"}.Validate(), `dispatch: pull: Subject: "a.*" is not a literal subject`},
		{"request timeout", NATSConfig{Subject: "a", Timeout: -time.Second}.Validate(), "dispatch: nats: Timeout: -1s is negative"},
		{"pull lease", PullConfig{Subject: "a", Lease: -time.Second}.Validate(), "dispatch: pull: Lease: -1s is negative"},
	}
	for _, s := range steps {
		if s.err == nil || !strings.HasPrefix(s.err.Error(), s.want) {
			t.Errorf("%s: got %v, want it to start with %q", s.name, s.err, s.want)
		}
	}
	if err := (PullConfig{Subject: "work.pool"}).Validate(); err != nil {
		t.Errorf("valid pull config: %v", err)
	}
	if err := (NATSConfig{Subject: "work.pool"}).Validate(); err != nil {
		t.Errorf("valid request config: %v", err)
	}
}
