package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The bytes-written/op figure is the block device's own count of sectors
// written, read from /proc/diskstats for the device that holds a system's
// files, over a claim+complete cell, divided by the operations the cell
// completed. Whatever the system defers (Pebble's flushes and compactions,
// PostgreSQL's dirty pages, the page cache's writeback) would otherwise
// land in a later cell or after the run, so each cell ends with a drain:
// the system's own hook (a wait for Pebble's compactions, a CHECKPOINT),
// a sync of every filesystem, then a wait for the device to fall quiet.
// Only then is the counter read. The same drain runs before the cell, so
// that the last cell's tail is not counted twice.

// sectorBytes is the unit of /proc/diskstats and /sys/block/*/stat,
// whatever the device's own sector size.
const sectorBytes = 512

const (
	drainTick    = 100 * time.Millisecond // one sample of the device's counter
	drainSamples = 3                      // quiet samples in a row
	// drainQuietBytes is the most a device may write in one tick and still
	// count as quiet: a journal commit or another process's trickle, not a
	// compaction or a checkpoint.
	drainQuietBytes = 256 << 10
	// maxBackgroundWindow bounds how long the devices are watched, with
	// the system idle, before each cell: as long as the cell, up to this.
	maxBackgroundWindow = time.Second
)

// blockDevice is a block device by its numbers, with the kernel's name
// for it (vda1, dm-0, nvme0n1p2).
type blockDevice struct {
	major, minor uint32
	name         string
}

func (d blockDevice) String() string { return fmt.Sprintf("%s (%d:%d)", d.name, d.major, d.minor) }

// noDeviceError says why a directory has no block device to count: it is
// in memory, on a network, or on a filesystem whose device is not visible
// here. short is what the table shows.
type noDeviceError struct{ short, why string }

func (e *noDeviceError) Error() string { return e.why }

// hostView is where the lookup reads the system's tables: "/" on the host,
// a fake tree in tests. devOf returns the device numbers of the
// filesystem holding path (its st_dev).
type hostView struct {
	root  string
	devOf func(path string) (major, minor uint32, err error)
}

func (h hostView) path(p string) string { return filepath.Join(h.root, p) }

// findDevice returns the block device that holds path. A filesystem with
// a real device (ext4, xfs on a disk, a partition or device-mapper) names
// it in st_dev; one with an anonymous device (major 0: tmpfs, overlay,
// btrfs, NFS, FUSE) is looked up in the mount table: btrfs by its source
// device, overlay by its upper directory, where its writes go; the rest
// have no device to count.
func findDevice(h hostView, path string) (blockDevice, error) {
	return findDeviceDepth(h, path, 0)
}

func findDeviceDepth(h hostView, path string, depth int) (blockDevice, error) {
	major, minor, err := h.devOf(path)
	if err != nil {
		return blockDevice{}, err
	}
	if major != 0 {
		return h.device(major, minor)
	}
	m, err := h.mountOf(major, minor, path)
	if err != nil {
		return blockDevice{}, err
	}
	switch {
	case m.fstype == "overlay":
		upper := m.option("upperdir")
		if upper == "" || depth > 2 {
			return blockDevice{}, &noDeviceError{"n/a (overlay)", "an overlay filesystem without an upper directory"}
		}
		d, err := findDeviceDepth(h, upper, depth+1)
		if err != nil {
			return blockDevice{}, &noDeviceError{"n/a (overlay)", fmt.Sprintf("an overlay filesystem whose upper directory %s has no device here: %v", upper, err)}
		}
		return d, nil
	case strings.HasPrefix(m.source, "/dev/"):
		return h.deviceNamed(m.source)
	default:
		what := m.fstype
		if what == "tmpfs" || what == "ramfs" {
			what += ", in memory"
		}
		return blockDevice{}, &noDeviceError{"n/a (" + m.fstype + ")", fmt.Sprintf("%s is on %s, which has no block device", path, what)}
	}
}

// device names the device major:minor from sysfs, or from
// /proc/diskstats where sysfs is not mounted.
func (h hostView) device(major, minor uint32) (blockDevice, error) {
	id := fmt.Sprintf("%d:%d", major, minor)
	if target, err := os.Readlink(h.path("sys/dev/block/" + id)); err == nil {
		return blockDevice{major: major, minor: minor, name: filepath.Base(target)}, nil
	}
	stats, err := os.ReadFile(h.path("proc/diskstats"))
	if err != nil {
		return blockDevice{}, err
	}
	for _, line := range strings.Split(string(stats), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[0] == strconv.Itoa(int(major)) && f[1] == strconv.Itoa(int(minor)) {
			return blockDevice{major: major, minor: minor, name: f[2]}, nil
		}
	}
	return blockDevice{}, &noDeviceError{"n/a (" + id + ")", "device " + id + " keeps no statistics"}
}

// deviceNamed finds the device of a mount source such as /dev/vdb2 or
// /dev/mapper/vg-data.
func (h hostView) deviceNamed(source string) (blockDevice, error) {
	name := filepath.Base(source)
	if strings.HasPrefix(source, "/dev/mapper/") {
		dms, _ := filepath.Glob(h.path("sys/block/dm-*/dm/name"))
		for _, f := range dms {
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == name {
				name = filepath.Base(filepath.Dir(filepath.Dir(f)))
				break
			}
		}
	}
	b, err := os.ReadFile(h.path("sys/class/block/" + name + "/dev"))
	if err != nil {
		return blockDevice{}, &noDeviceError{"n/a (" + name + ")", fmt.Sprintf("the mount source %s is not a block device known to sysfs", source)}
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return blockDevice{}, fmt.Errorf("bench: unexpected device numbers %q for %s", b, name)
	}
	return blockDevice{major: major, minor: minor, name: name}, nil
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	dev       string // major:minor
	point     string
	fstype    string
	source    string
	superOpts string
}

func (m mount) option(name string) string {
	for _, o := range strings.Split(m.superOpts, ",") {
		if v, ok := strings.CutPrefix(o, name+"="); ok {
			return v
		}
	}
	return ""
}

// mountOf returns the mount of device major:minor that holds path: of
// several (bind mounts, btrfs subvolumes), the one with the longest mount
// point that is a prefix of path.
func (h hostView) mountOf(major, minor uint32, path string) (mount, error) {
	b, err := os.ReadFile(h.path("proc/self/mountinfo"))
	if err != nil {
		return mount{}, err
	}
	abs, _ := filepath.Abs(path)
	id := fmt.Sprintf("%d:%d", major, minor)
	var best mount
	for _, line := range strings.Split(string(b), "\n") {
		m, ok := parseMountinfo(line)
		if !ok || m.dev != id {
			continue
		}
		if within(abs, m.point) && len(m.point) >= len(best.point) {
			best = m
		}
	}
	if best.dev == "" {
		return mount{}, &noDeviceError{"n/a (" + id + ")", fmt.Sprintf("no mount of device %s holds %s", id, path)}
	}
	return best, nil
}

func within(path, dir string) bool {
	return dir == "/" || path == dir || strings.HasPrefix(path, dir+"/")
}

// parseMountinfo reads "id parent major:minor root point opts [tags] -
// fstype source superopts".
func parseMountinfo(line string) (mount, bool) {
	f := strings.Fields(line)
	sep := slices.Index(f, "-")
	if sep < 6 || len(f) < sep+4 {
		return mount{}, false
	}
	return mount{dev: f[2], point: unescapeMount(f[4]), fstype: f[sep+1], source: unescapeMount(f[sep+2]), superOpts: f[sep+3]}, true
}

// unescapeMount undoes the octal escapes (\040 for a space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sectorsWritten returns the sectors written to d since boot, from
// /proc/diskstats, or from the device's stat file in sysfs.
func (h hostView) sectorsWritten(d blockDevice) (uint64, error) {
	if b, err := os.ReadFile(h.path("proc/diskstats")); err == nil {
		n, found, err := parseDiskstats(string(b), d.major, d.minor)
		if found || err != nil {
			return n, err
		}
	}
	b, err := os.ReadFile(h.path(fmt.Sprintf("sys/dev/block/%d:%d/stat", d.major, d.minor)))
	if err != nil {
		return 0, fmt.Errorf("bench: no statistics for %s: %w", d, err)
	}
	return parseBlockStat(string(b))
}

// parseDiskstats returns the sectors written of device major:minor in
// /proc/diskstats, whose lines are "major minor name" then the fields of
// a stat file, and whether the device is listed.
func parseDiskstats(text string, major, minor uint32) (uint64, bool, error) {
	ma, mi := strconv.Itoa(int(major)), strconv.Itoa(int(minor))
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != ma || f[1] != mi {
			continue
		}
		n, err := parseBlockStat(strings.Join(f[3:], " "))
		if err != nil {
			return 0, true, fmt.Errorf("bench: unexpected /proc/diskstats line %q", line)
		}
		return n, true, nil
	}
	return 0, false, nil
}

// parseBlockStat returns the sectors written from a stat file: reads
// completed, reads merged, sectors read, time reading, writes completed,
// writes merged, sectors written, and more that are not needed.
func parseBlockStat(text string) (uint64, error) {
	f := strings.Fields(text)
	if len(f) < 7 {
		return 0, fmt.Errorf("bench: unexpected block statistics %q", text)
	}
	n, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: unexpected block statistics %q", text)
	}
	return n, nil
}

// devices returns the distinct block devices holding dirs; a directory
// that does not exist yet is looked up by its nearest existing parent.
func (h hostView) devices(dirs []string) ([]blockDevice, error) {
	var ds []blockDevice
	for _, dir := range dirs {
		d, err := findDevice(h, dir)
		for errors.Is(err, fs.ErrNotExist) && filepath.Dir(dir) != dir {
			dir = filepath.Dir(dir)
			d, err = findDevice(h, dir)
		}
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return ds, nil
}

// wearSource is what a system writes to, as the harness counts it: the
// devices holding its files, and optionally its own count of bytes
// written and a hook that waits for the work it defers.
type wearSource struct {
	devs  []blockDevice
	noDev string // the table's text when there is no device to count
	// own returns the system's own running count of bytes written, nil
	// when it keeps none the harness can read.
	own func(ctx context.Context) (uint64, error)
	// settle waits for, or forces, the writes the system defers; nil
	// when it defers none the harness can reach.
	settle func(ctx context.Context) error
	// background is the rate the last begin measured, in bytes per second.
	background float64
}

// wearReading is one reading of a wearSource.
type wearReading struct {
	sectors uint64
	at      time.Time
	own     uint64
	ownOK   bool
	quiet   bool // the drain before the reading fell quiet within its limit
	// background is the rate, in bytes per second, at which the devices
	// wrote while the system was idle, just before the cell; begin sets it.
	background float64
}

// begin drains what earlier cells left, then watches the devices for
// window while the system is idle, to learn what the rest of the machine
// writes, and returns the reading the cell starts from.
func (w *wearSource) begin(ctx context.Context, h hostView, limit, window time.Duration) (wearReading, error) {
	r, err := w.drain(ctx, h, limit)
	if err != nil || len(w.devs) == 0 {
		return r, err
	}
	time.Sleep(window)
	n, err := w.sectors(h)
	if err != nil {
		return r, err
	}
	now := time.Now()
	r.background = float64(n-r.sectors) * sectorBytes / now.Sub(r.at).Seconds()
	r.sectors, r.at = n, now
	w.background = r.background
	if w.own != nil {
		r.own, err = w.own(ctx)
		r.ownOK = err == nil
	}
	return r, nil
}

// end drains what the cell left and returns the reading it ends at.
func (w *wearSource) end(ctx context.Context, h hostView, limit time.Duration) (wearReading, error) {
	return w.drain(ctx, h, limit)
}

// drain runs the system's hook, syncs every filesystem and waits until
// the devices have fallen back to the background rate (plus
// drainQuietBytes per tick) for drainSamples ticks in a row, or limit
// passed, then reads the counters.
func (w *wearSource) drain(ctx context.Context, h hostView, limit time.Duration) (wearReading, error) {
	start := time.Now()
	r := wearReading{quiet: true}
	if w.settle != nil {
		sctx, cancel := context.WithTimeout(ctx, limit)
		err := w.settle(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			r.quiet = false
		} else if err != nil {
			return r, err
		}
	}
	if len(w.devs) > 0 {
		syncAll()
		read := func() (uint64, error) { return w.sectors(h) }
		quietBytes := drainQuietBytes + uint64(2*w.background*drainTick.Seconds())
		n, fell, err := waitQuiet(read, quietBytes, func() bool { return time.Since(start) >= limit }, func() { time.Sleep(drainTick) })
		if err != nil {
			return r, err
		}
		r.sectors, r.quiet = n, r.quiet && fell
	}
	r.at = time.Now()
	if w.own != nil {
		n, err := w.own(ctx)
		r.own, r.ownOK = n, err == nil
	}
	return r, nil
}

func (w *wearSource) sectors(h hostView) (uint64, error) {
	var sum uint64
	for _, d := range w.devs {
		n, err := h.sectorsWritten(d)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// waitQuiet reads the counter every tick until it grew by at most
// quietBytes per tick drainSamples times in a row, or expired reports
// true, and returns the last reading and whether it was quiet.
func waitQuiet(read func() (uint64, error), quietBytes uint64, expired func() bool, tick func()) (uint64, bool, error) {
	prev, err := read()
	if err != nil {
		return 0, false, err
	}
	for quiet := 0; quiet < drainSamples; {
		if expired() {
			return prev, false, nil
		}
		tick()
		cur, err := read()
		if err != nil {
			return 0, false, err
		}
		if (cur-prev)*sectorBytes <= quietBytes {
			quiet++
		} else {
			quiet = 0
		}
		prev = cur
	}
	return prev, true, nil
}

// cellWearOf is what a cell of ops operations wrote between readings a
// and b: the device's bytes less what the background rate measured before
// the cell accounts for over the same time, per operation.
func cellWearOf(a, b wearReading, ops int) cellWear {
	bg := a.background * b.at.Sub(a.at).Seconds()
	dev := float64(b.sectors-a.sectors) * sectorBytes
	w := cellWear{dev: max(0, dev-bg) / float64(ops), background: bg / float64(ops), quiet: a.quiet && b.quiet}
	if a.ownOK && b.ownOK && b.own >= a.own {
		w.own, w.ownOK = float64(b.own-a.own)/float64(ops), true
	}
	return w
}
