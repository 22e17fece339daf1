package dispatch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/testenv"
)

// TestCheckReply: a reply subject is answered only inside the inbox of a
// worker of the lane; every subject a worker could use to steer the
// throttler's publish elsewhere is refused, with its reason.
func TestCheckReply(t *testing.T) {
	workers := []string{"render-1", "render-2"}
	for _, tc := range []struct {
		name, reply string
		workers     []string
		user        string // "" when refused
		reason      string
	}{
		{"own inbox", "_INBOX.render-1.abc.1", workers, "render-1", ""},
		{"own inbox, one token", "_INBOX.render-2.x", workers, "render-2", ""},
		{"any user when none named", "_INBOX.Zx9nuid.7", nil, "Zx9nuid", ""},
		{"another worker's inbox", "_INBOX.render-3.abc", workers, "", dispatch.ReplyNotWorker},
		{"a publisher's inbox", "_INBOX.shop.abc", workers, "", dispatch.ReplyNotWorker},
		{"inbox root only", "_INBOX.render-1", workers, "", dispatch.ReplyNotInbox},
		{"default inbox when none named", "_INBOX.Zx9nuid", nil, "Zx9nuid", ""},
		{"bare root", "_INBOX", nil, "", dispatch.ReplyNotInbox},
		{"stream purge", "$JS.API.STREAM.PURGE.THROTTLE_DEAD", workers, "", dispatch.ReplyMalformed},
		{"stream delete", "$JS.API.STREAM.DELETE.THROTTLE_demo", nil, "", dispatch.ReplyMalformed},
		{"consumer delete", "$JS.API.CONSUMER.DELETE.THROTTLE_demo.drain", nil, "", dispatch.ReplyMalformed},
		{"kv", "$KV.bucket.key", nil, "", dispatch.ReplyMalformed},
		{"control subject", "throttler.control.other", nil, "", dispatch.ReplyNotInbox},
		{"lane intake", "throttle.other", nil, "", dispatch.ReplyNotInbox},
		{"throttler's inbox", "_INBOX_throttler.abc.1", nil, "", dispatch.ReplyNotInbox},
		{"dollar token inside", "_INBOX.render-1.$JS", workers, "", dispatch.ReplyMalformed},
		{"full wildcard", "_INBOX.render-1.>", workers, "", dispatch.ReplyMalformed},
		{"token wildcard", "_INBOX.*.x", nil, "", dispatch.ReplyMalformed},
		{"space", "_INBOX.render-1.a b", workers, "", dispatch.ReplyMalformed},
		{"tab", "_INBOX.render-1.a\tb", workers, "", dispatch.ReplyMalformed},
		{"DEL", "_INBOX.render-1.a\x7f", workers, "", dispatch.ReplyMalformed},
		{"newline", "_INBOX.render-1.a\r\nPUB x 1", workers, "", dispatch.ReplyMalformed},
		{"non-ASCII", "_INBOX.render-1.é", workers, "", dispatch.ReplyMalformed},
		{"empty token", "_INBOX..x", nil, "", dispatch.ReplyMalformed},
		{"trailing dot", "_INBOX.render-1.x.", workers, "", dispatch.ReplyMalformed},
		{"empty", "", nil, "", dispatch.ReplyMalformed},
		{"too long", "_INBOX.render-1." + strings.Repeat("a", dispatch.MaxReplyLen), workers, "", dispatch.ReplyMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, err := dispatch.CheckReply(tc.reply, tc.workers)
			if tc.reason == "" {
				if err != nil || user != tc.user {
					t.Fatalf("CheckReply(%q) = %q, %v; want %q", tc.reply, user, err, tc.user)
				}
				return
			}
			var re *dispatch.ReplyError
			if !errors.As(err, &re) || !errors.Is(err, dispatch.ErrReplyRefused) || re.Reason != tc.reason || user != "" {
				t.Fatalf("CheckReply(%q) = %q, %v; want refused, %s", tc.reply, user, err, tc.reason)
			}
		})
	}
}

// TestPullRefusesForeignReplies: a pull request or an outcome report whose
// reply subject is outside a worker's inbox is never answered (nothing is
// published there), is counted with its reason, and parks nothing: no job
// is handed to it. A worker of the lane asking from its own inbox is still
// answered.
func TestPullRefusesForeignReplies(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	refused := make(chan string, 16)
	p, err := dispatch.OpenPull(nc, dispatch.PullConfig{Subject: "work", Workers: []string{"render-1"},
		Refused: func(reason string) { refused <- reason }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	spy, err := nc.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	ask := func(subject, reply string) {
		m := nats.NewMsg(subject)
		m.Reply = reply
		m.Header.Set(api.HeaderExpires, "1000")
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	foreign := []string{"$JS.API.STREAM.PURGE.THROTTLE_DEAD", "throttler.control.other", "_INBOX.render-2.x", "_INBOX.render-1.*"}
	for _, r := range foreign {
		ask("work", r)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	wantRefused := func(want map[string]int) {
		t.Helper()
		got := map[string]int{}
		n := 0
		for _, v := range want {
			n += v
		}
		for range n {
			select {
			case r := <-refused:
				got[r]++
			case <-time.After(5 * time.Second):
				t.Fatalf("refusals counted %v, want %v", got, want)
			}
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("refusals %v, want %v", got, want)
			}
		}
	}
	wantRefused(map[string]int{dispatch.ReplyMalformed: 2, dispatch.ReplyNotInbox: 1, dispatch.ReplyNotWorker: 1})

	// A worker of the lane asking from its own inbox gets the job; the
	// foreign requests parked nothing.
	jobs, err := nc.SubscribeSync("_INBOX.render-1.>")
	if err != nil {
		t.Fatal(err)
	}
	ask("work", "_INBOX.render-1.ok")
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	result := make(chan dispatch.Result, 1)
	go func() {
		result <- p.Deliver(context.Background(), dispatch.Job{ID: "j-1", Lane: "demo", Payload: []byte("x")})
	}()
	m, err := jobs.NextMsg(5 * time.Second)
	if err != nil || m.Subject != "_INBOX.render-1.ok" || m.Reply == "" {
		t.Fatalf("the worker of the lane got %v, %v; want the job", m, err)
	}
	// An outcome report whose reply is foreign is refused and not applied;
	// the same report from the worker's inbox settles the job.
	report := func(reply string) {
		o := nats.NewMsg(m.Reply)
		o.Reply = reply
		o.Header.Set(api.HeaderStatus, "dead")
		if err := nc.PublishMsg(o); err != nil {
			t.Fatal(err)
		}
	}
	report("$KV.b.k")
	wantRefused(map[string]int{dispatch.ReplyMalformed: 1})
	select {
	case r := <-result:
		t.Fatalf("a refused report settled the job: %+v", r)
	default:
	}
	report("_INBOX.render-1.report")
	select {
	case r := <-result:
		if r.Verdict != dispatch.Dead {
			t.Fatalf("verdict %v, want dead", r.Verdict)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker's report did not settle the job")
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := spy.NextMsg(100 * time.Millisecond)
		if err != nil {
			break
		}
		for _, r := range append(foreign, "$KV.b.k") {
			if m.Subject == r && m.Header.Get(api.HeaderStatus) != "" {
				t.Fatalf("the throttler answered on the foreign reply %q", r)
			}
		}
	}
}

// TestPullGuessedInboxGetsNothing: a worker may name the inbox of another
// worker of the same lane (NATS does not say who asked), but not the
// random subject that worker listens on: the job handed there finds no
// subscriber and comes back unstarted (ErrWorkerGone).
func TestPullGuessedInboxGetsNothing(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := dispatch.OpenPull(nc, dispatch.PullConfig{Subject: "work", Workers: []string{"render-1", "render-2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m := nats.NewMsg("work")
	m.Reply = "_INBOX.render-2.guessed"
	m.Header.Set(api.HeaderExpires, "5000")
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := p.Deliver(ctx, dispatch.Job{ID: "j-1", Lane: "demo", Payload: []byte("x")})
	if !res.Unstarted || !errors.Is(res.Err, dispatch.ErrWorkerGone) {
		t.Fatalf("result %+v, want unstarted with ErrWorkerGone", res)
	}
}
