package main

import (
	"io/fs"
	"syscall"
)

// allocated is the disk a file occupies: zeros written ahead count, holes
// do not.
func allocated(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
