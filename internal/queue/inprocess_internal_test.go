package queue

import (
	"github.com/throttler/throttler/internal/tracectx"

	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// within fails the test when f has not returned after d: a write that
// should not wait for the reader would otherwise hang the test.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestBufferedConnWriteDoesNotWaitForReader: on a bare net.Pipe a write
// returns only when the other end read it; through the buffer it returns
// at once, and the bytes arrive later, in order.
func TestBufferedConnWriteDoesNotWaitForReader(t *testing.T) {
	client, server := net.Pipe()
	b := newBufferedConn(client, 1<<20)
	within(t, 10*time.Second, "a write nobody reads yet", func() {
		for i := range 100 {
			if _, err := fmt.Fprintf(b, "line %d\n", i); err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}
	})
	r := bufio.NewReader(server)
	for i := range 100 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if want := fmt.Sprintf("line %d\n", i); line != want {
			t.Fatalf("read %q, want %q", line, want)
		}
	}
	go func() { _, _ = io.Copy(io.Discard, server) }()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBufferedConnKeepsEachWriteWhole: concurrent writers' writes never
// interleave, and each writer's writes arrive in its order.
func TestBufferedConnKeepsEachWriteWhole(t *testing.T) {
	client, server := net.Pipe()
	b := newBufferedConn(client, 4096) // small: writers also wait for room
	const writers, each = 8, 500
	got := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(server)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		got <- lines
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				// One write per line, longer than a pipe read may take at once.
				line := fmt.Sprintf("%d %d %s\n", w, i, strings.Repeat("x", 200))
				if _, err := b.Write([]byte(line)); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	lines := <-got
	if len(lines) != writers*each {
		t.Fatalf("%d lines arrived, want %d", len(lines), writers*each)
	}
	next := make([]int, writers)
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 || len(f[2]) != 200 {
			t.Fatalf("a torn line: %q", l)
		}
		w, _ := strconv.Atoi(f[0])
		i, _ := strconv.Atoi(f[1])
		if i != next[w] {
			t.Fatalf("writer %d: line %d arrived when %d was due", w, i, next[w])
		}
		next[w]++
	}
}

// TestBufferedConnBackpressure: with max bytes waiting and nobody reading,
// a write waits for room until its deadline.
func TestBufferedConnBackpressure(t *testing.T) {
	client, server := net.Pipe()
	b := newBufferedConn(client, 1024)
	defer b.Close()
	// Closed first: with nobody reading, Close would wait closeFlushWait
	// for a flush that cannot come.
	defer server.Close()
	chunk := make([]byte, 1024)
	within(t, 10*time.Second, "writes that fit", func() {
		for range 2 { // one the pump holds, one waiting
			if _, err := b.Write(chunk); err != nil {
				t.Error(err)
				return
			}
		}
	})
	// The pump may not have taken the first chunk yet: then the second
	// write already found the buffer full and waited for it. Either way
	// the buffer is full now, or will be after one more.
	if err := b.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var err error
	within(t, 10*time.Second, "a write over the bound", func() {
		for range 2 {
			if _, err = b.Write(chunk); err != nil {
				return
			}
		}
	})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write into a full buffer nobody drains: %v, want %v", err, os.ErrDeadlineExceeded)
	}
}

// TestBufferedConnCloseFlushes: Close hands what is buffered to the other
// end before closing; a write after Close fails.
func TestBufferedConnCloseFlushes(t *testing.T) {
	client, server := net.Pipe()
	b := newBufferedConn(client, 1<<20)
	want := strings.Repeat("0123456789", 10_000)
	if _, err := io.WriteString(b, want); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		all, _ := io.ReadAll(server)
		got <- string(all)
	}()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != want {
		t.Fatalf("%d bytes arrived before the close, want %d", len(g), len(want))
	}
	if _, err := b.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a write after Close: %v, want %v", err, net.ErrClosed)
	}
}

// TestBufferedConnWriteErrorSticks: once the other end is gone, writes
// fail instead of filling the buffer.
func TestBufferedConnWriteErrorSticks(t *testing.T) {
	client, server := net.Pipe()
	b := newBufferedConn(client, 1<<20)
	defer b.Close()
	server.Close()
	var err error
	for range 1000 {
		if _, err = b.Write([]byte("x")); err != nil {
			break
		}
		time.Sleep(time.Millisecond) // let the pump meet the closed pipe
	}
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("writes to a closed pipe: %v, want %v", err, io.ErrClosedPipe)
	}
}

// TestJobMsgHeaderKeys: jobMsg fills the header map directly, which is
// only right while every key is canonical (what Header.Set would store).
func TestJobMsgHeaderKeys(t *testing.T) {
	now := time.Now()
	job := Job{ID: "id-1", MsgID: "id-1#2", Lane: "demo", Key: "k", ContentType: "text/plain", Payload: []byte("x"),
		Outside: true, Notify: "throttler.notify.i1", Wait: "throttler.records.i1", NotifyID: "n-1", Reply: "replies.shop.1", RecordRev: 42, ReplayedFrom: 9, Attempts: 3, NotBefore: now, EnqueuedAt: now, Expires: now,
		Trace: tracectx.Context{Parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", State: "rojo=1", Baggage: "k=v"}}
	msg := jobMsg(job)
	want := nats.Header{}
	for k, v := range msg.Header {
		if c := textproto.CanonicalMIMEHeaderKey(k); c != k {
			t.Errorf("header key %q is not canonical (%q)", k, c)
		}
		if len(v) != 1 {
			t.Errorf("header %s has %d values", k, len(v))
		}
		want.Set(k, v[0])
	}
	if len(msg.Header) != jobHeaders {
		t.Errorf("%d headers, want %d: %v", len(msg.Header), jobHeaders, msg.Header)
	}
	got := decodeJob("demo", msg.Header, msg.Data, "k", 7, true, now)
	got.Payload, job.Payload = nil, nil
	job.MsgID = "" // not carried back
	if !got.NotBefore.Equal(job.NotBefore.Truncate(time.Millisecond)) || !got.EnqueuedAt.Equal(job.EnqueuedAt.Truncate(time.Millisecond)) ||
		!got.Expires.Equal(job.Expires.Truncate(time.Millisecond)) {
		t.Errorf("times: %v %v %v, want %v", got.NotBefore, got.EnqueuedAt, got.Expires, now)
	}
	got.NotBefore, got.EnqueuedAt, job.NotBefore, job.EnqueuedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	got.Expires, job.Expires = time.Time{}, time.Time{}
	if fmt.Sprint(got) != fmt.Sprint(job) {
		t.Errorf("decoded %+v, want %+v", got, job)
	}
	if msg.Subject != InternalSubject("demo", "k") {
		t.Errorf("subject %s", msg.Subject)
	}
}

// TestJobMsgHeaderCount: a job with every field set (found by reflection,
// so a field added later is set too) gets at most jobHeaders headers, the
// room jobMsg keeps for them without allocating.
func TestJobMsgHeaderCount(t *testing.T) {
	var job Job
	v := reflect.ValueOf(&job).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64, reflect.Int32:
			f.SetInt(3)
		case reflect.Uint, reflect.Uint64, reflect.Uint32:
			f.SetUint(3)
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Struct:
			switch f.Type() {
			case reflect.TypeFor[time.Time]():
				f.Set(reflect.ValueOf(time.Now()))
			case reflect.TypeFor[tracectx.Context]():
				f.Set(reflect.ValueOf(tracectx.Context{Parent: "x", State: "x", Baggage: "x"}))
			}
		}
	}
	if n := len(jobMsg(job).Header); n > jobHeaders {
		t.Fatalf("a job with every field set has %d headers; raise jobHeaders to %d", n, n)
	}
	// The message, its subject, the map, the shared values, the numbers
	// formatted (the record's revision, attempts, not-before, expiry and
	// first-store time: a fresh job over HTTP has none of the last four),
	// and one in the map: the header arrays stay on the stack. Every field
	// set makes 17 headers: a map of more than 8 entries spills from one
	// group into a table (two more allocations).
	if n := testing.AllocsPerRun(100, func() { jobMsg(job) }); n > 11 {
		t.Errorf("jobMsg allocates %v times, want at most 11", n)
	}
	// Without trace context, a record, a callback, a reply and a replay
	// (9 headers) the bound is the former one: a lane without results
	// pays nothing for them.
	job.Trace, job.Wait, job.RecordRev, job.NotifyID, job.Callback, job.Reply = tracectx.Context{}, "", 0, "", "", ""
	job.ReplayedFrom = 0
	if n := testing.AllocsPerRun(100, func() { jobMsg(job) }); n > 8 {
		t.Errorf("jobMsg without trace context and a record allocates %v times, want at most 8", n)
	}
}

// TestJobMsgSaysTheIDOnce: a job stored under its own id (every intake)
// carries it in Nats-Msg-Id alone, and reads back with that id; a copy
// under another msg id keeps both.
func TestJobMsgSaysTheIDOnce(t *testing.T) {
	now := time.Now()
	for _, job := range []Job{
		{ID: "order-42", Lane: "demo", ContentType: "application/json", Payload: []byte("{}")},
		{ID: "order-42", MsgID: "order-42", Lane: "demo", Payload: []byte("{}")},
	} {
		msg := jobMsg(job)
		if _, ok := msg.Header[HeaderJobID]; ok {
			t.Errorf("msg id %q: %s is set: %v", job.MsgID, HeaderJobID, msg.Header)
		}
		if got := msg.Header.Get(jetstream.MsgIDHeader); got != job.ID {
			t.Errorf("msg id %q: Nats-Msg-Id %q, want %q", job.MsgID, got, job.ID)
		}
		if got := decodeJob("demo", msg.Header, msg.Data, "", 7, true, now); got.ID != job.ID {
			t.Errorf("msg id %q: decoded id %q, want %q", job.MsgID, got.ID, job.ID)
		}
	}
	retry := Job{ID: "order-42", MsgID: "order-42#attempt-1", Lane: "demo", Attempts: 1}
	msg := jobMsg(retry)
	if msg.Header.Get(HeaderJobID) != retry.ID || msg.Header.Get(jetstream.MsgIDHeader) != retry.MsgID {
		t.Errorf("retry copy headers %v", msg.Header)
	}
	if got := decodeJob("demo", msg.Header, msg.Data, "", 7, true, now); got.ID != retry.ID {
		t.Errorf("retry copy decoded id %q, want %q", got.ID, retry.ID)
	}
}
