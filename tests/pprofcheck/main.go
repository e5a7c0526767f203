// Command pprofcheck validates a pprof profile with google/pprof's own parser.
//
// Usage: pprofcheck FILE
//
// It reads FILE (gzip-compressed or raw protobuf), parses it with
// profile.Parse, runs CheckValid, and prints "ok <N> samples" (exit 0) or the
// error (exit 1). Built by `make test` against Debian's
// golang-github-google-pprof-dev (GOPATH=/usr/share/gocode, GO111MODULE=off).
package main

import (
	"fmt"
	"os"

	"github.com/google/pprof/profile"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pprofcheck FILE")
		os.Exit(2)
	}
	if err := check(os.Args[1]); err != nil {
		fmt.Printf("%s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func check(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// profile.Parse accepts both gzip-compressed and raw protobuf input.
	p, err := profile.Parse(f)
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	if err := p.CheckValid(); err != nil {
		return fmt.Errorf("invalid: %w", err)
	}
	if len(p.SampleType) == 0 {
		return fmt.Errorf("invalid: no sample types")
	}
	fmt.Printf("ok %d samples\n", len(p.Sample))
	return nil
}
