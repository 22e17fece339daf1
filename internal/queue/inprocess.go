package queue

import (
	"net"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// The embedded server's in-process connection is a net.Pipe: a write
// returns only once the server's read loop has taken every byte. nats.go
// writes while holding its connection lock, so with a pipe every publisher,
// and the reader handing JetStream acknowledgements to their waiters, queues
// behind the server reading and parsing the last flush (a mutex profile of
// the ingest benchmark showed that wait as most of a request's time). A
// socket has a send buffer for this; bufferedConn gives the pipe one.

// maxPipeBuffer bounds the bytes a bufferedConn holds besides the chunk
// being handed to the server; a write that would pass it waits (up to its
// deadline) for room, which is the backpressure a full socket buffer gives.
// A single write larger than the bound is taken when nothing else waits.
const maxPipeBuffer = 4 << 20

// closeFlushWait bounds how long Close waits for buffered bytes to reach
// the server before closing the pipe.
const closeFlushWait = 2 * time.Second

// inProcess is a nats.InProcessConnProvider whose connections write
// through a buffer (bufferedConn).
type inProcess struct{ srv *server.Server }

// InProcessConn implements nats.InProcessConnProvider.
func (p inProcess) InProcessConn() (net.Conn, error) {
	c, err := p.srv.InProcessConn()
	if err != nil {
		return nil, err
	}
	return newBufferedConn(c, maxPipeBuffer), nil
}

// bufferedConn is a net.Conn whose writes are copied into a buffer and
// written to the underlying connection, in order, by a goroutine of its
// own. Reads go straight to the underlying connection. A write error of the
// underlying connection fails every later write. Safe for concurrent use
// as a net.Conn is.
type bufferedConn struct {
	net.Conn
	max int

	mu       sync.Mutex
	pending  []byte // written by the caller, not yet taken by the pump
	spare    []byte // the pump's last chunk, reused when it is done
	err      error  // the pump's write error, or net.ErrClosed after Close
	closing  bool
	deadline time.Time // of writes waiting for room

	wake    chan struct{} // cap 1: pending has bytes, or closing
	room    chan struct{} // cap 1: the pump took pending
	drained chan struct{} // closed when the pump has ended
	once    sync.Once
}

func newBufferedConn(c net.Conn, max int) *bufferedConn {
	b := &bufferedConn{Conn: c, max: max,
		wake: make(chan struct{}, 1), room: make(chan struct{}, 1), drained: make(chan struct{})}
	go b.pump()
	return b
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Write copies p into the buffer; it waits for room when the buffer holds
// max bytes already, until the write deadline.
func (b *bufferedConn) Write(p []byte) (int, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.err != nil || b.closing {
			err := b.err
			b.mu.Unlock()
			if err == nil {
				err = net.ErrClosed
			}
			return 0, err
		}
		if len(b.pending) == 0 || len(b.pending)+len(p) <= b.max {
			b.pending = append(b.pending, p...)
			b.mu.Unlock()
			signal(b.wake)
			return len(p), nil
		}
		dl := b.deadline
		b.mu.Unlock()
		var expired <-chan time.Time
		if !dl.IsZero() {
			d := time.Until(dl)
			if d <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			expired = timer.C
		}
		select {
		case <-b.room:
		case <-b.drained:
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// pump writes what Write buffered, in order, until Close or a write error.
func (b *bufferedConn) pump() {
	defer close(b.drained)
	for {
		<-b.wake
		for {
			b.mu.Lock()
			chunk := b.pending
			b.pending, b.spare = b.spare[:0], nil
			closing := b.closing
			b.mu.Unlock()
			signal(b.room)
			if len(chunk) == 0 {
				if closing {
					return
				}
				break
			}
			_, err := b.Conn.Write(chunk)
			b.mu.Lock()
			if err != nil && b.err == nil {
				b.err = err
			}
			failed := b.err != nil
			if cap(chunk) <= 2*b.max {
				b.spare = chunk
			}
			b.mu.Unlock()
			signal(b.room)
			if failed {
				return
			}
		}
	}
}

// SetWriteDeadline bounds the wait of writes for room in the buffer.
func (b *bufferedConn) SetWriteDeadline(t time.Time) error {
	b.mu.Lock()
	b.deadline = t
	b.mu.Unlock()
	return nil
}

// SetDeadline sets the read deadline of the underlying connection and the
// write deadline of the buffer.
func (b *bufferedConn) SetDeadline(t time.Time) error {
	_ = b.SetWriteDeadline(t)
	return b.Conn.SetReadDeadline(t)
}

// Close hands what is buffered to the server (waiting at most
// closeFlushWait), then closes the underlying connection.
func (b *bufferedConn) Close() error {
	var err error
	b.once.Do(func() {
		b.mu.Lock()
		b.closing = true
		b.mu.Unlock()
		signal(b.wake)
		select {
		case <-b.drained:
		case <-time.After(closeFlushWait):
		}
		err = b.Conn.Close()
		<-b.drained
		b.mu.Lock()
		if b.err == nil {
			b.err = net.ErrClosed
		}
		b.mu.Unlock()
	})
	return err
}
