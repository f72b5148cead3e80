package main

import (
	"bufio"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// device is the block device that holds a directory, as /proc/diskstats
// names it, or "" when there is none (tmpfs, overlay without a backing
// device listed).
type device string

// deviceOf finds the device of dir from its major and minor numbers.
func deviceOf(dir string) device {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return ""
	}
	major, minor := (st.Dev>>8)&0xfff|(st.Dev>>32)&^0xfff, st.Dev&0xff|(st.Dev>>12)&^0xff
	f, err := os.Open("/proc/diskstats")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 2 && fields[0] == strconv.FormatUint(major, 10) && fields[1] == strconv.FormatUint(minor, 10) {
			return device(fields[2])
		}
	}
	return ""
}

// written returns the bytes the kernel has written to d since boot, or -1.
// /proc/diskstats counts 512-byte sectors whatever the device's own size.
func (d device) written() int64 {
	if d == "" {
		return -1
	}
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 9 && fields[2] == string(d) {
			sectors, err := strconv.ParseInt(fields[9], 10, 64)
			if err != nil {
				return -1
			}
			return sectors * 512
		}
	}
	return -1
}

// allocated is the disk a file occupies: zeros written ahead count, holes
// do not.
func allocated(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
