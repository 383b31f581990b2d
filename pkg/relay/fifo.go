// SPDX-License-Identifier: Apache-2.0

package relay

// fifo is a ring-buffer queue. Its memory grows to the largest length it has
// held and is then reused, so a steady flow through it allocates nothing.
// It is not safe for concurrent use.
type fifo[T any] struct {
	buf  []T
	head int
	n    int
}

func (q *fifo[T]) len() int { return q.n }

func (q *fifo[T]) push(v T) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = v
	q.n++
}

// front returns the oldest element, which stays queued; q must not be empty.
func (q *fifo[T]) front() *T { return &q.buf[q.head] }

// pop removes and returns the oldest element; q must not be empty.
func (q *fifo[T]) pop() T {
	var zero T
	v := q.buf[q.head]
	q.buf[q.head] = zero
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	return v
}

// grow doubles the buffer (8 at first), keeping the order. The length stays
// a power of two so that indexes wrap with a mask.
func (q *fifo[T]) grow() {
	size := max(8, 2*len(q.buf))
	buf := make([]T, size)
	for i := range q.n {
		buf[i] = q.buf[(q.head+i)&(len(q.buf)-1)]
	}
	q.buf, q.head = buf, 0
}
