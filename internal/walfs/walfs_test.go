package walfs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallWALFS fills in small steps, so that a short test sees many fills and
// the log catching up with them.
func smallFS() *FS {
	return &FS{FS: vfs.Default, ahead: 64 << 10, chunk: 16 << 10, fatal: func(msg string) { panic(msg) }}
}

func TestWALFileKeepsZerosAheadAndNeverOverwritesTheLog(t *testing.T) {
	fs := smallFS()
	name := filepath.Join(t.TempDir(), "000001.log")
	f, err := fs.Create(name, walCategory)
	require.NoError(t, err)
	w, ok := f.(*walFile)
	require.True(t, ok, "a log file on disk is wrapped")

	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	for len(want) < 1<<20 {
		p := make([]byte, 1+rng.IntN(20<<10))
		for i := range p {
			p[i] = byte(1 + rng.IntN(255)) // never zero, so a stray fill shows
		}
		n, err := f.Write(p)
		require.NoError(t, err)
		require.Equal(t, len(p), n)
		want = append(want, p...)
	}
	require.NoError(t, f.SyncData())
	require.NoError(t, f.Close())

	w.mu.Lock()
	fills, zeroed := w.fillCount, w.zeroed
	w.mu.Unlock()
	assert.Greater(t, fills, 10, "the log kept asking for more zeros")
	assert.GreaterOrEqual(t, zeroed, int64(len(want)))

	got, err := os.ReadFile(name)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(got), len(want))
	assert.True(t, bytes.Equal(want, got[:len(want)]), "the log's bytes are intact")
	assert.Zero(t, bytes.IndexFunc(got[len(want):], func(r rune) bool { return r != 0 })+1,
		"only zeros follow the log")
	assert.Greater(t, len(got)-len(want), 0, "zeros are kept ahead of the log's end")
	assert.Equal(t, Written{Log: int64(len(want)), Zeros: int64(fills) * 16 << 10}, fs.Written(),
		"the log's bytes and the fills' zeros are counted apart")

	table, err := fs.Create(filepath.Join(t.TempDir(), "000002.sst"), "sstable")
	require.NoError(t, err)
	_, err = table.Write(make([]byte, 100))
	require.NoError(t, err)
	require.NoError(t, table.Close())
	assert.Equal(t, int64(100), fs.Written().Tables)
	assert.Equal(t, int64(len(want))+int64(fills)*16<<10+100, fs.Written().Total())
}

func TestWALFileReusedLogKeepsItsOldBlocks(t *testing.T) {
	fs := smallFS()
	dir := t.TempDir()
	old := bytes.Repeat([]byte{0xff}, 100<<10)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "000001.log"), old, 0o644))

	f, err := fs.ReuseForWrite(filepath.Join(dir, "000001.log"), filepath.Join(dir, "000002.log"), walCategory)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "000002.log"), f.(*walFile).name, "a failure names the log being written")
	written := bytes.Repeat([]byte{7}, 50<<10)
	_, err = f.Write(written)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	got, err := os.ReadFile(filepath.Join(dir, "000002.log"))
	require.NoError(t, err)
	require.Greater(t, len(got), len(old), "zeros were added after the old log's end")
	assert.Equal(t, written, got[:len(written)])
	assert.Equal(t, old[len(written):], got[len(written):len(old)], "the old log's blocks are left to Pebble")
	assert.Equal(t, make([]byte, len(got)-len(old)), got[len(old):])
}

func TestWALFSFillsOnlyLogFilesOnDisk(t *testing.T) {
	dir := t.TempDir()
	disk := smallFS()
	table, err := disk.Create(filepath.Join(dir, "000003.sst"), "pebble-flush")
	require.NoError(t, err)
	defer table.Close()
	_, wrapped := table.(*walFile)
	assert.False(t, wrapped, "tables are written as they are")

	mem := &FS{FS: vfs.NewMem(), ahead: 64 << 10, chunk: 16 << 10}
	log, err := mem.Create("000001.log", walCategory)
	require.NoError(t, err)
	_, err = log.Write(make([]byte, 100<<10))
	require.NoError(t, err)
	require.NoError(t, log.Close())
	info, err := mem.Stat("000001.log")
	require.NoError(t, err)
	assert.Equal(t, int64(100<<10), info.Size(), "a log in memory has nothing to gain from zeros")
}

// failingFile fails every write, sync and close with err, and positioned
// writes with writeAt if set.
type failingFile struct {
	vfs.File
	err, writeAt error
}

func (f failingFile) WriteAt(p []byte, off int64) (int, error) {
	if f.writeAt != nil {
		return 0, f.writeAt
	}
	return f.File.WriteAt(p, off)
}

func (f failingFile) Write([]byte) (int, error)      { return 0, f.err }
func (f failingFile) Sync() error                    { return f.err }
func (f failingFile) SyncData() error                { return f.err }
func (f failingFile) SyncTo(int64) (bool, error)     { return false, f.err }
func (f failingFile) Close() error                   { return f.err }
func (f failingFile) Preallocate(int64, int64) error { return nil }

// Pebble does not always get as far as its own Fatalf after a failed log
// operation (a failed close during a memtable rotation panics with its mutex
// released), so the log file itself must end the process, before Pebble
// sees the error. So must a blob file, live store or not, since Pebble's
// flush crashes on some of its failures.
func TestWALFileFailureIsFatalBeforePebbleSeesIt(t *testing.T) {
	injected := errors.New("injected")
	for _, c := range []struct {
		name, op string
		call     func(f vfs.File) error
	}{
		{"Write", "write", func(f vfs.File) error { _, err := f.Write([]byte("x")); return err }},
		{"Sync", "sync", func(f vfs.File) error { return f.Sync() }},
		{"SyncData", "sync", func(f vfs.File) error { return f.SyncData() }},
		{"SyncTo", "sync", func(f vfs.File) error { _, err := f.SyncTo(1); return err }},
		{"Close", "close", func(f vfs.File) error { return f.Close() }},
	} {
		for _, file := range []struct {
			name     string
			category vfs.DiskWriteCategory
			live     bool
		}{
			{"000004.log", walCategory, true},
			// A blob file's failure is fatal even outside the live store:
			// Pebble's flush would crash on it anyway (see blobFile).
			{"000005.blob", "pebble-memtable-flush", true},
			{"000005.blob", "pebble-memtable-flush", false},
		} {
			mem := vfs.NewMem()
			inner, err := mem.Create(file.name, file.category)
			require.NoError(t, err)
			var fatal []string
			fs := &FS{FS: mem, fatal: func(msg string) { fatal = append(fatal, msg) }}
			fs.live.Store(file.live)
			f, err := fs.wrap(failingFile{File: inner, err: injected}, file.name, file.category, nil)
			require.NoError(t, err)

			err = c.call(f)
			assert.ErrorIs(t, err, injected, "%s %s", c.name, file.name)
			assert.Equal(t, []string{c.op + " " + file.name + ": injected"}, fatal, "%s %s", c.name, file.name)
		}
	}
}

// A fill's sync flushes the log's pages too, and may be the one sync told
// that one of them was lost; a fill's failed write only stops the filling.
func TestWALFileFillFailures(t *testing.T) {
	for _, c := range []struct {
		name  string
		file  failingFile
		fatal []string
	}{
		{"sync", failingFile{err: errors.New("injected")}, []string{"sync 000004.log: injected"}},
		{"write", failingFile{err: errors.New("injected"), writeAt: errors.New("no space")}, nil},
	} {
		mem := vfs.NewMem()
		inner, err := mem.Create("000004.log", walCategory)
		require.NoError(t, err)
		c.file.File = inner
		var fatal []string
		fs := &FS{FS: mem, ahead: 64 << 10, chunk: 16 << 10, fatal: func(msg string) { fatal = append(fatal, msg) }}
		fs.live.Store(true)
		w := &walFile{File: c.file, fs: fs, name: "000004.log", filling: true}
		w.cond.L = &w.mu

		w.fill(0)
		assert.Equal(t, c.fatal, fatal, c.name)
		assert.Zero(t, w.zeroed, c.name)
		assert.True(t, w.stopped, "a failed fill stops the filling (%s)", c.name)
		assert.False(t, w.filling, c.name)
	}
}

// Rotating the log creates the next one and syncs the directory; Pebble
// panics on either failure, so both end the process first. Outside the
// live store (Open still running, Close begun) failures are only returned,
// and a fill's lost sync then surfaces at Close.
func TestWALFSRotationFailuresAndLiveness(t *testing.T) {
	injected := errors.New("injected")
	var fatal []string
	fs := &FS{FS: vfs.NewMem(), fatal: func(msg string) { fatal = append(fatal, msg) }}
	fs.live.Store(true)

	_, err := fs.wrap(nil, "000005.log", walCategory, injected)
	assert.ErrorIs(t, err, injected)
	_, err = fs.wrap(nil, "000006.sst", "pebble-flush", injected)
	assert.ErrorIs(t, err, injected)
	_, err = fs.wrap(nil, "000007.blob", "pebble-flush", injected)
	assert.ErrorIs(t, err, injected)
	assert.Equal(t, []string{"create 000005.log: injected"}, fatal, "only a log's creation is fatal")

	require.NoError(t, fs.MkdirAll("db", 0o755))
	dir, err := fs.OpenDir("db")
	require.NoError(t, err)
	dir.(*walDir).File = failingFile{File: dir.(*walDir).File, err: injected}
	assert.ErrorIs(t, dir.Sync(), injected)
	assert.Equal(t, "sync db: injected", fatal[len(fatal)-1])

	fatal = nil
	fs.live.Store(false)
	inner, err := fs.FS.Create("000007.log", walCategory)
	require.NoError(t, err)
	f, err := fs.wrap(failingFile{File: inner, err: injected}, "000007.log", walCategory, nil)
	require.NoError(t, err)
	_, err = f.Write([]byte("x"))
	assert.ErrorIs(t, err, injected)
	assert.ErrorIs(t, dir.Sync(), injected)
	assert.Empty(t, fatal, "nothing acknowledged depends on the log outside the live store")

	w := f.(*walFile)
	w.File = inner
	w.lost = injected
	assert.ErrorIs(t, w.Close(), injected, "a fill's lost sync is reported by Close")
	assert.Empty(t, fatal)
}
