package pebblestore

import (
	"io/fs"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The store's files hold stored responses (card fragments, addresses,
// tokens): its directory is its owner's alone, and so is each file it
// writes, whatever the process's umask.
const (
	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// privateFS is the operating system's filesystem with every file the
// store creates made readable and writable by its owner alone.
type privateFS struct{ vfs.FS }

func (p privateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.Create(name, c)
	return private(name, f, err)
}

func (p privateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := p.FS.OpenReadWrite(name, c, opts...)
	return private(name, f, err)
}

func (p privateFS) Unwrap() vfs.FS { return p.FS }

// private gives the file f, just opened as name, fileMode, and closes it
// when the mode cannot be set.
func private(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(name, fileMode); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// warnIfShared logs when dir, on the operating system's filesystem, can
// be read by users other than its owner: a store created by an earlier
// version, or a directory made beforehand, keeps the mode it has.
func warnIfShared(fsys vfs.FS, dir string, log *slog.Logger) {
	if _, ok := fsys.(privateFS); !ok {
		return
	}
	st, err := os.Stat(dir)
	if err == nil && st.Mode().Perm()&0o077 != 0 {
		log.Warn("idem: the data directory can be read by other users, and it holds stored responses; chmod 700 it",
			"dir", dir, "mode", st.Mode().Perm().String())
	}
}
