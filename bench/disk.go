package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// diskSystem is not a store: it is the most any store that makes each write
// durable before answering can do on this disk. One writer goroutine takes
// 1 KiB records from callers, writes a batch with one pwrite and makes it
// durable with one fdatasync. At concurrency N it waits until all N callers
// have handed in a record (or no more come for a moment, at the end of a
// cell), so every sync carries N records and ops/s is the group-commit
// ceiling: one record per operation, whereas a claim+complete needs two
// durable writes one after the other. A store that shares syncs as well as
// this would reach half of it.
//
// The file is written full of zeros and synced before any measurement, and
// records overwrite it in a ring, so a sync carries only data and no block
// allocation or file-size change, as a recycled write-ahead log does.
type diskSystem struct {
	f      *os.File
	reqs   chan diskReq
	batch  atomic.Int64 // records per sync the writer waits for
	stop   chan struct{}
	done   chan struct{}
	syncs  atomic.Int64
	writes atomic.Int64
	bytes  atomic.Int64 // written with pwrite, the zero fill left out

	lastSyncs, lastWrites int64 // read by syncsPerOp only, from one goroutine
}

type diskReq struct {
	rec  []byte
	done chan error
}

const (
	diskFileBytes = 64 << 20
	// diskGrace is how long the writer waits for the next record of a
	// batch that is not full yet: long enough for woken callers to come
	// back with their next record, short against a sync.
	diskGrace = 500 * time.Microsecond
)

var errNoReplay = errors.New("bench: this system has no replay workload")

func openDisk(e env) (system, error) {
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(e.dir, "records"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < diskFileBytes; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros, off); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	s := &diskSystem{f: f, reqs: make(chan diskReq, 1024), stop: make(chan struct{}), done: make(chan struct{})}
	s.batch.Store(1)
	go s.writer()
	return s, nil
}

func (s *diskSystem) startCell(conc int) { s.batch.Store(int64(conc)) }

func (s *diskSystem) writer() {
	defer close(s.done)
	var (
		off     int64
		buf     []byte
		waiting []chan error
		timer   = time.NewTimer(time.Hour)
	)
	timer.Stop()
	for {
		// Block for the first record of a batch.
		select {
		case r := <-s.reqs:
			buf, waiting = append(buf[:0], r.rec...), append(waiting[:0], r.done)
		case <-s.stop:
			return
		}
		// Then gather the rest of the batch.
		want := int(s.batch.Load())
	gather:
		for len(waiting) < want {
			select {
			case r := <-s.reqs:
				buf, waiting = append(buf, r.rec...), append(waiting, r.done)
				continue
			default:
			}
			timer.Reset(diskGrace)
			select {
			case r := <-s.reqs:
				buf, waiting = append(buf, r.rec...), append(waiting, r.done)
				timer.Stop()
			case <-timer.C:
				break gather
			}
		}
		if off+int64(len(buf)) > diskFileBytes {
			off = 0
		}
		_, err := s.f.WriteAt(buf, off)
		if err == nil {
			err = fdatasync(s.f)
		}
		off += int64(len(buf))
		s.bytes.Add(int64(len(buf)))
		s.syncs.Add(1)
		s.writes.Add(int64(len(waiting)))
		for _, c := range waiting {
			c <- err
		}
	}
}

var diskDonePool = sync.Pool{New: func() any { return make(chan error, 1) }}

func (s *diskSystem) claimComplete(ctx context.Context, o op, body []byte) error {
	done := diskDonePool.Get().(chan error)
	s.reqs <- diskReq{rec: body, done: done}
	err := <-done
	diskDonePool.Put(done)
	return err
}

func (s *diskSystem) replay(context.Context, op) ([]byte, error) { return nil, errNoReplay }

func (s *diskSystem) noReplay() {}

func (s *diskSystem) syncsPerOp() float64 {
	syncs, writes := s.syncs.Load(), s.writes.Load()
	ds, dw := syncs-s.lastSyncs, writes-s.lastWrites
	s.lastSyncs, s.lastWrites = syncs, writes
	if dw == 0 {
		return 0
	}
	return float64(ds) / float64(dw)
}

func (s *diskSystem) bytesWritten(context.Context) (uint64, error) {
	return uint64(s.bytes.Load()), nil
}

func (s *diskSystem) close() error {
	close(s.stop)
	<-s.done
	return s.f.Close()
}
