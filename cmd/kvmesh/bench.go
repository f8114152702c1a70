package main

import (
	"context"
	"errors"
	"io"
)

// runBench is not built yet; its issue delivers it.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("bench: not built yet")
}
