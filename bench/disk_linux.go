package main

import (
	"os"
	"syscall"
)

// fdatasync makes f's data durable without its metadata, as Pebble syncs
// its write-ahead log on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
