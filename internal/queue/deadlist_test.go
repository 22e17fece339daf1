package queue_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// storeDead stores n dead letters of lane as Dead writes them, with
// payloads of size bytes, and after each one a dead letter of another
// lane (a lane's sequences are not contiguous); it returns the lane's
// sequences.
func storeDead(t testing.TB, nc *nats.Conn, lane string, n, size int) []uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var seqs []uint64
	for i := range n {
		m := nats.NewMsg(queue.DeadSubject(lane))
		m.Data = make([]byte, size)
		m.Header.Set(queue.HeaderJobID, fmt.Sprintf("%s-%d", lane, i))
		m.Header.Set(queue.HeaderLane, lane)
		if i%2 == 0 {
			m.Header.Set(queue.HeaderKey, "k"+strconv.Itoa(i))
		}
		m.Header.Set(queue.HeaderContentType, "application/json")
		m.Header.Set(queue.HeaderAttempts, strconv.Itoa(1+i%3))
		m.Header.Set(queue.HeaderDeadReason, "rejected by target")
		m.Header.Set(queue.HeaderLastStatus, "400")
		m.Header.Set(queue.HeaderLastError, "target answered 400")
		m.Header.Set(queue.HeaderDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
		m.Header.Set(queue.HeaderExpiresAt, strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
		if _, err := js.Publish(ctx, queue.DeadSubject("other"), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	return seqs
}

// countRequests counts the requests sent on subject (a subscriber beside
// the server's own): count tells how many were sent before it was called.
func countRequests(t *testing.T, url, subject string) (count func() int) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() int {
		// The server routes a request to the stream and to this
		// subscriber in no fixed order: its answer may come back before
		// the copy sent here was queued. The count is read until it has
		// not moved for a while (within a bound).
		read := func() int {
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			n, _, err := sub.Pending()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		n, still := read(), 0
		for deadline := time.Now().Add(2 * time.Second); still < 5 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			if m := read(); m != n {
				n, still = m, 0
				continue
			}
			still++
		}
		return n
	}
}

// pageThrough lists lane from after 0 with limit, page by page, and
// returns the pages' lengths and every dead letter in order; it checks
// that each page's NextAfter is its last sequence, 0 on the last page.
func pageThrough(t *testing.T, q *queue.Queue, lane string, limit int) (sizes []int, all []api.DeadLetter) {
	t.Helper()
	var after uint64
	for range 1000 {
		page, err := q.ListDeadPage(context.Background(), lane, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page.Dead))
		all = append(all, page.Dead...)
		if page.NextAfter == 0 {
			return sizes, all
		}
		if last := page.Dead[len(page.Dead)-1].Seq; page.NextAfter != last {
			t.Fatalf("after %d: next_after %d, want the page's last sequence %d", after, page.NextAfter, last)
		}
		after = page.NextAfter
	}
	t.Fatal("no last page")
	return nil, nil
}

func seqsOf(dead []api.DeadLetter) []uint64 {
	var out []uint64
	for _, d := range dead {
		out = append(out, d.Seq)
	}
	return out
}

// TestListDeadReadsAPagePerRequest: a page of dead letters is one batch
// direct get, not a message get per dead letter; paging with the cursor
// goes through the lane's dead letters oldest first, each once, as the
// listing one by one shows them (without payloads), whichever lanes'
// dead letters lie between.
func TestListDeadReadsAPagePerRequest(t *testing.T) {
	srv, q, nc := deadQueue(t)
	seqs := storeDead(t, nc, "demo", 25, 40)
	direct := countRequests(t, srv, "$JS.API.DIRECT.GET."+queue.DeadStream)
	each := countRequests(t, srv, "$JS.API.STREAM.MSG.GET."+queue.DeadStream)

	subs := nc.NumSubscriptions()
	sizes, all := pageThrough(t, q, "demo", 10)
	if !reflect.DeepEqual(sizes, []int{10, 10, 5}) {
		t.Fatalf("pages of %v, want 10, 10, 5", sizes)
	}
	if got := seqsOf(all); !reflect.DeepEqual(got, seqs) {
		t.Fatalf("sequences %v, want %v", got, seqs)
	}
	if d, e := direct(), each(); d != 3 || e != 0 {
		t.Fatalf("%d direct gets and %d message gets for 3 pages, want 3 and 0", d, e)
	}
	want, err := queue.ListDeadEach(context.Background(), q, "demo", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(all, want) {
		t.Fatalf("listed\n%+v\none by one\n%+v", all, want)
	}
	for i, d := range all {
		if d.ID != fmt.Sprintf("demo-%d", i) || d.Payload != nil || d.Size != 40 || d.Expires == nil {
			t.Fatalf("dead letter %d: %+v", i, d)
		}
	}
	// A cursor between two of the lane's sequences (another lane's),
	// a page that ends exactly at the last one, and past the end.
	page, err := q.ListDeadPage(context.Background(), "demo", seqs[4]+1, 20)
	if err != nil || len(page.Dead) != 20 || page.Dead[0].Seq != seqs[5] || page.NextAfter != seqs[24] {
		t.Fatalf("after %d: %v (next %d) %v", seqs[4]+1, seqsOf(page.Dead), page.NextAfter, err)
	}
	if page, err = q.ListDeadPage(context.Background(), "demo", seqs[24], 20); err != nil || len(page.Dead) != 0 || page.NextAfter != 0 {
		t.Fatalf("after the last: %+v %v", page, err)
	}
	if dead, err := q.ListDead(context.Background(), "nobody", 0, 10); err != nil || len(dead) != 0 {
		t.Fatalf("a lane without dead letters: %v %v", dead, err)
	}
	// A listing whose caller has gone leaves nothing behind either: the
	// listings share one inbox, made at the first, and none waits on it.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.ListDead(gone, "demo", 0, 10); !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("a cancelled listing: %v", err)
	}
	if n := nc.NumSubscriptions(); n != subs+1 {
		t.Fatalf("%d subscriptions after the listings, %d before: want their one inbox more", n, subs)
	}
	if n := queue.DeadListingsWaiting(q); n != 0 {
		t.Fatalf("%d listings still wait for an answer", n)
	}
}

// TestListDeadBoundsItsBytes: a page of large dead letters stops at the
// bytes a listing reads: shorter than its limit, with next_after its last
// sequence, so paging on still goes through every one, in order.
func TestListDeadBoundsItsBytes(t *testing.T) {
	_, q, nc := deadQueue(t)
	seqs := storeDead(t, nc, "demo", 10, 1000)
	queue.SetDeadPageBytes(q, 3000)
	sizes, all := pageThrough(t, q, "demo", 100)
	if len(sizes) < 3 {
		t.Fatalf("pages of %v: the bound cut none short", sizes)
	}
	for _, n := range sizes {
		if n > 3 {
			t.Fatalf("pages of %v: more than 3,000 bytes read in one", sizes)
		}
	}
	if got := seqsOf(all); !reflect.DeepEqual(got, seqs) {
		t.Fatalf("sequences %v, want %v", got, seqs)
	}
	// The last page is cut short too: it names no next page only when
	// none is left.
	queue.SetDeadPageBytes(q, 0)
	if page, err := q.ListDeadPage(context.Background(), "demo", 0, 100); err != nil || len(page.Dead) != 10 || page.NextAfter != 0 {
		t.Fatalf("without the bound: %d dead letters, next %d, %v", len(page.Dead), page.NextAfter, err)
	}
}

// TestListDeadWithoutDirectGets: a dead-letter stream made without direct
// gets (an older version) gets them when the queue starts; one changed
// back while the queue runs (an older instance starting during an
// upgrade) is listed one message get per dead letter, the same answer.
func TestListDeadWithoutDirectGets(t *testing.T) {
	srv, q, nc := deadQueue(t)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, queue.DeadStream)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CachedInfo().Config.AllowDirect {
		t.Fatal("the dead-letter stream has no direct gets")
	}
	seqs := storeDead(t, nc, "demo", 12, 40)
	before, err := q.ListDead(ctx, "demo", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	each := countRequests(t, srv, "$JS.API.STREAM.MSG.GET."+queue.DeadStream)
	sizes, all := pageThrough(t, q, "demo", 5)
	if !reflect.DeepEqual(sizes, []int{5, 5, 2}) || !reflect.DeepEqual(seqsOf(all), seqs) || !reflect.DeepEqual(all, before) {
		t.Fatalf("pages of %v: %v, want %v", sizes, seqsOf(all), seqs)
	}
	// One get per dead letter, and one that finds none after the last.
	if n := each(); n != 13 {
		t.Fatalf("%d message gets, want 13", n)
	}

	// A queue starting on it turns direct gets back on.
	q2, err := queue.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := q2.EnsureDeadLetters(ctx, queue.DeadConfig{MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || !info.Config.AllowDirect {
		t.Fatalf("direct gets after a start: %v", err)
	}
	if dead, err := q2.ListDead(ctx, "demo", 0, 100); err != nil || !reflect.DeepEqual(dead, before) {
		t.Fatalf("listed %v %v", seqsOf(dead), err)
	}
}

// deadQueue is newBareQueue with its server's URL.
func deadQueue(t *testing.T) (string, *queue.Queue, *nats.Conn) {
	t.Helper()
	url := testenv.StartNATS(t).ClientURL()
	q, nc := bareQueueOn(t, url)
	return url, q, nc
}
