// Package walfs wraps the filesystem under the embedded store's Pebble
// database: it keeps synced zeros ahead of each write-ahead log's end, and
// it carries the fatal-fault policy, ending the process at the first
// failure that could let an unsynced write be acknowledged.
package walfs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Every claim and every completion waits for a sync of the write-ahead log,
// so the cost of that sync bounds how fast idem can go. Syncing a write that
// grows a file also commits the new size and block allocation through the
// filesystem journal; syncing a write over blocks that already exist flushes
// the data alone, which is much cheaper. Pebble reuses old log files once it has some, but a fresh store,
// and each log beyond the reused ones, grows its file one write at a time.
//
// FS therefore keeps a stretch of written, synced zeros ahead of the end
// of each log file, filled in the background, so that the log's own writes
// land on existing blocks. Pebble reads a run of zeros after the last record
// as the end of the log: it is what preallocation leaves behind.
//
// FS also ends the process at the first failed write, sync or close of
// a log, on disk or in memory. Pebble treats each of these as fatal too,
// but not always by calling its logger's Fatalf: when the failure meets a
// memtable rotation, Pebble panics with its own mutex released, and the
// runtime dies of "unlock of unlocked mutex" instead, with no clear message
// and the wrong exit status. The same goes for creating the next log and
// syncing the directory that holds it, which Pebble does while rotating.
// Only while the store is live, though: before Open is done and once Close
// has begun, nothing acknowledged depends on the log, and a failure is only
// returned.
//
// It also wraps the blob files that flushes and compactions write, whose
// failures are fatal at any time: see blobFile.
type FS struct {
	vfs.FS
	ahead int64            // zeros to keep ahead of the log's end
	chunk int64            // zeros written by one fill
	fatal func(msg string) // ends the process on a failed log or blob file operation; returns only in tests
	live  atomic.Bool      // set by SetLive once Pebble is open, cleared when it closes
	// written counts the bytes written to every file Pebble creates, by
	// kind: flash wears with what is written, and Pebble's own metrics
	// leave out the zeros.
	written [numKinds]atomic.Int64
}

// The kinds of file Written tells apart.
const (
	kindLog = iota
	kindZeros
	kindTables
	kindBlobs
	kindOther
	numKinds
)

// Written is what an FS has written, in bytes, by kind of file.
type Written struct {
	Log    int64 // the write-ahead logs' records
	Zeros  int64 // the zeros kept ahead of the logs
	Tables int64 // sstables: flushes and compactions
	Blobs  int64 // blob files: flushes, and rewrites of their garbage
	Other  int64 // manifests and options files
}

// Total is every byte written.
func (w Written) Total() int64 { return w.Log + w.Zeros + w.Tables + w.Blobs + w.Other }

// Written returns the bytes written so far through fs.
func (fs *FS) Written() Written {
	n := func(k int) int64 { return fs.written[k].Load() }
	return Written{Log: n(kindLog), Zeros: n(kindZeros), Tables: n(kindTables), Blobs: n(kindBlobs), Other: n(kindOther)}
}

// kindOf is the kind of a file Pebble creates, by its name.
func kindOf(name string) int {
	switch {
	case strings.HasSuffix(name, ".log"):
		return kindLog
	case strings.HasSuffix(name, ".sst"):
		return kindTables
	case strings.HasSuffix(name, ".blob"):
		return kindBlobs
	}
	return kindOther
}

// countFile counts what is written through it into n.
type countFile struct {
	vfs.File
	n *atomic.Int64
}

func (c *countFile) Write(p []byte) (int, error) {
	n, err := c.File.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := c.File.WriteAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// walCategory is the write category Pebble gives its log files.
const walCategory vfs.DiskWriteCategory = "pebble-wal"

// FS keeps up to ZeroAhead bytes of zeros ahead of a log's end, written
// half of that at a time: a fill of a chunk takes a few tens of
// milliseconds, and what is kept ahead lasts several times that at the
// rates the log is written, so the log rarely catches up with a fill.
const ZeroAhead = 8 << 20

// New wraps fs for logs that grow to about logBytes, the memtable size.
// What is kept ahead is at most a quarter of that: Pebble keeps its last
// few log files for reuse, zeros and all, so a store with small memtables
// keeps a small floor of disk.
func New(fs vfs.FS, logBytes int64) *FS {
	ahead := min(ZeroAhead, logBytes/4) &^ (pageBytes - 1)
	return &FS{FS: fs, ahead: ahead, chunk: ahead / 2, fatal: Exit}
}

// SetLive says whether the store is live: from the end of Pebble's Open to
// the start of its Close, a failure of the log ends the process; outside,
// it is only returned.
func (fs *FS) SetLive(live bool) { fs.live.Store(live) }

// ExitCode is the process exit status after a fatal storage error
// (EX_IOERR in sysexits.h).
const ExitCode = 74

// Exit ends the process after a fatal storage error, with msg on standard
// error and status ExitCode.
func Exit(msg string) {
	fmt.Fprintf(os.Stderr, "idem: fatal storage error, exiting so that no unsynced write is acknowledged: %s\n", msg)
	os.Exit(ExitCode)
}

// Logger is the logger Pebble gets: informational lines are dropped,
// errors go to l, and a fatal error, which Pebble raises when the log
// cannot be written or synced, ends the process through Exit.
type Logger struct{ L *slog.Logger }

// Infof drops Pebble's chatter.
func (Logger) Infof(string, ...any) {}

// Errorf passes an error on to L.
func (p Logger) Errorf(format string, args ...any) {
	p.L.Error("idem: storage error", "err", fmt.Sprintf(format, args...))
}

// Fatalf ends the process: continuing could acknowledge a write that is
// not on disk.
func (Logger) Fatalf(format string, args ...any) {
	Exit(fmt.Sprintf(format, args...))
}

func (fs *FS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	return fs.wrap(f, name, category, err)
}

func (fs *FS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return fs.wrap(f, newname, category, err)
}

func (fs *FS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, category, opts...)
	if err != nil {
		return f, err
	}
	return &countFile{File: f, n: &fs.written[kindOf(name)]}, nil
}

// OpenDir wraps the store's directories, whose syncs make a new log's name
// durable.
func (fs *FS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	if err != nil {
		return f, err
	}
	return &walDir{File: f, fs: fs, name: name}, nil
}

type walDir struct {
	vfs.File
	fs   *FS
	name string
}

func (d *walDir) Sync() error { return d.fs.check("sync", d.name, d.File.Sync()) }

// check hands a failure of the log to fs.fatal, before Pebble sees it.
func (fs *FS) check(op, name string, err error) error {
	if err != nil && fs.live.Load() {
		fs.fatal(fmt.Sprintf("%s %s: %v", op, name, err))
	}
	return err
}

func (fs *FS) wrap(f vfs.File, name string, category vfs.DiskWriteCategory, err error) (vfs.File, error) {
	if err == nil && category != walCategory {
		f = &countFile{File: f, n: &fs.written[kindOf(name)]}
	}
	if err == nil && strings.HasSuffix(name, ".blob") {
		return &blobFile{File: f, fs: fs, name: name}, nil
	}
	if category != walCategory {
		return f, err
	}
	if err != nil {
		return f, fs.check("create", name, err)
	}
	w := &walFile{File: f, fs: fs, name: name}
	w.cond.L = &w.mu
	// A reused log already has blocks up to its size; they hold an older
	// log, which Pebble tells apart from the new one by its log number.
	info, err := f.Stat()
	if err == nil {
		w.zeroed = info.Size()
	}
	// Files without a descriptor live in memory, where a sync costs the
	// same either way: they are never filled.
	w.stopped = err != nil || f.Fd() == vfs.InvalidFd
	return w, nil
}

// walFile is one log file with zeros kept ahead of its end, whose failures
// end the process. Pebble writes a log from one goroutine at a time, with
// Write; a fill runs beside it in another goroutine, always wholly beyond
// the end of what the log wrote.
type walFile struct {
	vfs.File
	fs   *FS
	name string

	mu        sync.Mutex
	cond      sync.Cond
	end       int64 // guarded by mu: where the log's next Write goes
	zeroed    int64 // guarded by mu: the file has blocks up to here
	fillFrom  int64 // guarded by mu: where the running fill starts, if filling
	filling   bool  // guarded by mu
	stopped   bool  // guarded by mu: set by Close, or after a failed fill
	lost      error // guarded by mu: a fill's failed sync, which the log's own syncs may not see again
	fillCount int   // guarded by mu: fills done, for tests
}

// blobFile is a blob file that a flush or compaction writes. When the last
// write, the sync or the close that finish such a file fails, Pebble
// v2.1.7 (blob.FileWriter.Close) aborts the file it has just closed and
// dereferences nil in its background goroutine, which kills the process
// with a bare stack trace, whether the store is live or not. That last
// write cannot be told apart from earlier ones, whose failure Pebble
// survives by retrying, so every failed write, sync or close of a blob file
// ends the process with a clear message instead. A full disk during a
// flush or compaction of large values therefore ends the process too.
// Nothing is lost: a flush's records are still in the log, a compaction's
// in its input files. A failed creation is left to Pebble, which retries.
// A Pebble release that fixes its Close makes this wrapper unnecessary.
type blobFile struct {
	vfs.File
	fs   *FS
	name string
}

func (b *blobFile) Write(p []byte) (int, error) {
	n, err := b.File.Write(p)
	return n, b.check("write", err)
}

func (b *blobFile) Sync() error     { return b.check("sync", b.File.Sync()) }
func (b *blobFile) SyncData() error { return b.check("sync", b.File.SyncData()) }
func (b *blobFile) Close() error    { return b.check("close", b.File.Close()) }

func (b *blobFile) SyncTo(length int64) (bool, error) {
	full, err := b.File.SyncTo(length)
	return full, b.check("sync", err)
}

func (b *blobFile) check(op string, err error) error {
	if err != nil {
		b.fs.fatal(fmt.Sprintf("%s %s: %v", op, b.name, err))
	}
	return err
}

const pageBytes = 4096

// zeros is what a fill writes, never modified.
var zeros = make([]byte, 1<<20)

func (w *walFile) Write(p []byte) (int, error) {
	w.mu.Lock()
	// Never write where a fill is writing zeros.
	for w.filling && w.end+int64(len(p)) > w.fillFrom {
		w.cond.Wait()
	}
	next := w.end + int64(len(p))
	if !w.filling && !w.stopped && w.zeroed-next < w.fs.ahead {
		w.filling = true
		// Whole pages, so that no page is shared between the log's writes
		// and a fill's.
		w.fillFrom = (max(w.zeroed, next) + pageBytes - 1) &^ (pageBytes - 1)
		go w.fill(w.fillFrom)
	}
	w.mu.Unlock()

	n, err := w.File.Write(p)
	w.fs.written[kindLog].Add(int64(n))

	w.mu.Lock()
	w.end += int64(n)
	w.mu.Unlock()
	return n, w.check("write", err)
}

func (w *walFile) Sync() error     { return w.check("sync", w.File.Sync()) }
func (w *walFile) SyncData() error { return w.check("sync", w.File.SyncData()) }

func (w *walFile) SyncTo(length int64) (bool, error) {
	full, err := w.File.SyncTo(length)
	return full, w.check("sync", err)
}

func (w *walFile) check(op string, err error) error { return w.fs.check(op, w.name, err) }

// fill writes a chunk of zeros from off and syncs it, so that the size and
// the blocks are on disk before the log writes over them. A failed write (a
// full disk, say) only stops the filling: the log then grows its file as it
// would have without FS, and reports its own errors. A failed sync is
// fatal like the log's own: it flushes the log's pages too, and Linux
// reports a lost page to one sync of a descriptor only, so the log's next
// sync could succeed over a write that never reached the disk.
func (w *walFile) fill(off int64) {
	var syncErr error
	err := w.writeZeros(off)
	if err == nil {
		syncErr = w.check("sync", w.File.SyncData())
		err = syncErr
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.filling = false
	w.fillCount++
	if err != nil {
		w.stopped = true
		w.lost = syncErr
	} else {
		w.zeroed = off + w.fs.chunk
	}
	w.cond.Broadcast()
}

func (w *walFile) writeZeros(off int64) error {
	for done := int64(0); done < w.fs.chunk; {
		n := min(w.fs.chunk-done, int64(len(zeros)))
		m, err := w.File.WriteAt(zeros[:n], off+done)
		w.fs.written[kindZeros].Add(int64(m))
		if err != nil {
			return err
		}
		done += n
	}
	return nil
}

// Preallocate does nothing: Pebble would reserve space without writing it,
// and the first write into reserved space still goes through the journal.
// The fills do the job instead.
func (w *walFile) Preallocate(off, length int64) error { return nil }

// Close waits for a running fill, which writes to the same descriptor.
func (w *walFile) Close() error {
	w.mu.Lock()
	w.stopped = true
	for w.filling {
		w.cond.Wait()
	}
	lost := w.lost
	w.mu.Unlock()
	return w.check("close", errors.Join(lost, w.File.Close()))
}
