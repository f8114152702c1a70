// Package archcheck holds the repository's shape to the rules its
// layout was rearranged by (docs/DESIGN.md, the map): no product file
// over 700 lines, no type over 30 methods, and the summary package free
// of request rendering and encoding/json. It has no code, only a test
// that reads the tree, so a change that breaks a rule fails `go test ./...`
// with the file or type to split.
package archcheck
