"""Text of a token stream, assembled from the tokens' bytes without losing any.

A token's piece may end inside a UTF-8 character (byte-fallback tokens, byte-level BPE), so text
cannot be decoded piece by piece. `TextStream` is an incremental UTF-8 decoder over the pieces:

- a character comes out as soon as its last byte arrives;
- an invalid byte sequence comes out as U+FFFD as soon as it cannot become valid any more (one
  U+FFFD per maximal invalid subpart, the Unicode / WHATWG practice, which is also what
  `bytes.decode("utf-8", "replace")` of the whole text gives), and decoding goes on after it;
- an incomplete sequence at the end waits for the next piece; `flush()` ends the stream and
  turns whatever is still held into U+FFFD.

So `"".join(stream.push(p) for p in pieces) + stream.flush()` always equals
`b"".join(pieces).decode("utf-8", "replace")`: streamed text equals detokenized text.
llama.cpp's CLI writes the raw bytes and leaves this to the terminal; its server holds back an
incomplete trailing sequence the same way (validate_utf8).
"""

from __future__ import annotations

import codecs


class TextStream:
    """Bytes in (token pieces), text out; see the module docstring. One per generated stream."""

    def __init__(self):
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        """The text completed by `piece` ('' while a character is still incomplete)."""
        return self._dec.decode(piece, final=False)

    def flush(self) -> str:
        """End of the stream: the bytes still held as text (U+FFFD for an incomplete character,
        '' when nothing is held). The stream can be reused afterwards."""
        text = self._dec.decode(b"", final=True)
        self._dec.reset()
        return text

    @property
    def pending(self) -> bytes:
        """Bytes held back: the start of a character that the next piece may complete."""
        return self._dec.getstate()[0]
