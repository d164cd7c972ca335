// The canonical form of a JSON request body, byte for byte the one the Go client's
// middleware makes (encoding/json decoding with UseNumber, then Marshal): object keys
// sorted by their UTF-8 bytes, a repeated key keeping its last value, no insignificant
// whitespace, numbers kept as written, strings escaped as Go escapes them (<, >, & and
// U+2028, U+2029 as \u escapes), invalid UTF-8 in strings read as U+FFFD byte by byte.
// Anything that is not exactly one JSON value is returned unchanged.

const maxDepth = 10_000;

class NotJSON extends Error {}

/** Returns the canonical form of a JSON body, or the body itself when it is not JSON. */
export function canonicalJSON(body: Uint8Array): Uint8Array {
  try {
    const parser = new Parser(body);
    parser.space();
    const out = parser.value(0);
    parser.space();
    if (parser.pos !== body.length) return body;
    return Buffer.from(out, "utf8");
  } catch (err) {
    if (err instanceof NotJSON) return body;
    throw err;
  }
}

/** Whether a Content-Type names JSON: application/json or any type ending in +json. */
export function isJSONMediaType(contentType: string | undefined): boolean {
  if (!contentType) return false;
  const mediaType = (contentType.split(";")[0] ?? "").trim().toLowerCase();
  if (!/^[!#$%&'*+\-.^_`|~0-9a-z]+\/[!#$%&'*+\-.^_`|~0-9a-z]+$/.test(mediaType)) return false;
  return mediaType === "application/json" || (mediaType.length > 5 && mediaType.endsWith("+json"));
}

class Parser {
  pos = 0;
  constructor(private readonly b: Uint8Array) {}

  space(): void {
    while (this.pos < this.b.length) {
      const c = this.b[this.pos];
      if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) return;
      this.pos++;
    }
  }

  value(depth: number): string {
    if (depth > maxDepth) throw new NotJSON();
    const c = this.b[this.pos];
    switch (c) {
      case 0x7b: // {
        return this.object(depth + 1);
      case 0x5b: // [
        return this.array(depth + 1);
      case 0x22: // "
        return quote(this.string());
      case 0x74:
        return this.literal("true");
      case 0x66:
        return this.literal("false");
      case 0x6e:
        return this.literal("null");
      default:
        return this.number();
    }
  }

  literal(word: string): string {
    for (let i = 0; i < word.length; i++) {
      if (this.b[this.pos + i] !== word.charCodeAt(i)) throw new NotJSON();
    }
    this.pos += word.length;
    return word;
  }

  number(): string {
    const start = this.pos;
    const digit = () => {
      const c = this.b[this.pos];
      return c !== undefined && c >= 0x30 && c <= 0x39;
    };
    const digits = () => {
      if (!digit()) throw new NotJSON();
      while (digit()) this.pos++;
    };
    if (this.b[this.pos] === 0x2d) this.pos++;
    if (this.b[this.pos] === 0x30) this.pos++;
    else digits();
    if (this.b[this.pos] === 0x2e) {
      this.pos++;
      digits();
    }
    if (this.b[this.pos] === 0x65 || this.b[this.pos] === 0x45) {
      this.pos++;
      if (this.b[this.pos] === 0x2b || this.b[this.pos] === 0x2d) this.pos++;
      digits();
    }
    return Buffer.from(this.b.subarray(start, this.pos)).toString("latin1");
  }

  object(depth: number): string {
    this.pos++;
    const members = new Map<string, string>();
    this.space();
    if (this.b[this.pos] === 0x7d) {
      this.pos++;
      return "{}";
    }
    for (;;) {
      if (this.b[this.pos] !== 0x22) throw new NotJSON();
      const key = this.string();
      this.space();
      if (this.b[this.pos] !== 0x3a) throw new NotJSON();
      this.pos++;
      this.space();
      members.delete(key);
      members.set(key, this.value(depth));
      this.space();
      const c = this.b[this.pos++];
      if (c === 0x7d) break;
      if (c !== 0x2c) throw new NotJSON();
      this.space();
    }
    const keys = [...members.keys()].sort((a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")));
    return `{${keys.map((k) => `${quote(k)}:${members.get(k)}`).join(",")}}`;
  }

  array(depth: number): string {
    this.pos++;
    const items: string[] = [];
    this.space();
    if (this.b[this.pos] === 0x5d) {
      this.pos++;
      return "[]";
    }
    for (;;) {
      items.push(this.value(depth));
      this.space();
      const c = this.b[this.pos++];
      if (c === 0x5d) break;
      if (c !== 0x2c) throw new NotJSON();
      this.space();
    }
    return `[${items.join(",")}]`;
  }

  /** Reads a string token into the text it stands for. */
  string(): string {
    this.pos++;
    let out = "";
    for (;;) {
      const c = this.b[this.pos];
      if (c === undefined || c < 0x20) throw new NotJSON();
      if (c === 0x22) {
        this.pos++;
        return out;
      }
      if (c === 0x5c) {
        out += this.escape();
        continue;
      }
      if (c < 0x80) {
        out += String.fromCharCode(c);
        this.pos++;
        continue;
      }
      const [rune, size] = decodeRune(this.b, this.pos);
      out += String.fromCodePoint(rune);
      this.pos += size;
    }
  }

  escape(): string {
    const c = this.b[this.pos + 1];
    this.pos += 2;
    switch (c) {
      case 0x22:
        return '"';
      case 0x5c:
        return "\\";
      case 0x2f:
        return "/";
      case 0x62:
        return "\b";
      case 0x66:
        return "\f";
      case 0x6e:
        return "\n";
      case 0x72:
        return "\r";
      case 0x74:
        return "\t";
      case 0x75: {
        const unit = this.hex4();
        if (unit < 0xd800 || unit > 0xdfff) return String.fromCharCode(unit);
        // A surrogate pair, as Go's decoder reads it: a lone half is U+FFFD.
        if (unit < 0xdc00 && this.b[this.pos] === 0x5c && this.b[this.pos + 1] === 0x75) {
          const save = this.pos;
          this.pos += 2;
          const low = this.hex4();
          if (low >= 0xdc00 && low <= 0xdfff) return String.fromCharCode(unit, low);
          this.pos = save;
        }
        return "\ufffd";
      }
      default:
        throw new NotJSON();
    }
  }

  hex4(): number {
    const text = Buffer.from(this.b.subarray(this.pos, this.pos + 4)).toString("latin1");
    if (!/^[0-9a-fA-F]{4}$/.test(text)) throw new NotJSON();
    this.pos += 4;
    return Number.parseInt(text, 16);
  }
}

/** Decodes one UTF-8 sequence as Go's utf8.DecodeRune does: an invalid one is U+FFFD of size 1. */
function decodeRune(b: Uint8Array, i: number): [number, number] {
  const c0 = b[i] ?? 0;
  const cont = (k: number, lo = 0x80, hi = 0xbf) => {
    const c = b[i + k];
    return c !== undefined && c >= lo && c <= hi ? c & 0x3f : -1;
  };
  if (c0 >= 0xc2 && c0 <= 0xdf) {
    const c1 = cont(1);
    if (c1 >= 0) return [((c0 & 0x1f) << 6) | c1, 2];
  } else if (c0 >= 0xe0 && c0 <= 0xef) {
    const c1 = cont(1, c0 === 0xe0 ? 0xa0 : 0x80, c0 === 0xed ? 0x9f : 0xbf);
    const c2 = c1 >= 0 ? cont(2) : -1;
    if (c2 >= 0) return [((c0 & 0x0f) << 12) | (c1 << 6) | c2, 3];
  } else if (c0 >= 0xf0 && c0 <= 0xf4) {
    const c1 = cont(1, c0 === 0xf0 ? 0x90 : 0x80, c0 === 0xf4 ? 0x8f : 0xbf);
    const c2 = c1 >= 0 ? cont(2) : -1;
    const c3 = c2 >= 0 ? cont(3) : -1;
    if (c3 >= 0) return [((c0 & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3, 4];
  }
  return [0xfffd, 1];
}

/** Writes a string as Go's encoding/json does, with its HTML escaping. */
function quote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0) ?? 0;
    switch (ch) {
      case '"':
        out += '\\"';
        continue;
      case "\\":
        out += "\\\\";
        continue;
      case "\b":
        out += "\\b";
        continue;
      case "\f":
        out += "\\f";
        continue;
      case "\n":
        out += "\\n";
        continue;
      case "\r":
        out += "\\r";
        continue;
      case "\t":
        out += "\\t";
        continue;
    }
    if (c < 0x20 || ch === "<" || ch === ">" || ch === "&" || c === 0x2028 || c === 0x2029) {
      out += `\\u${c.toString(16).padStart(4, "0")}`;
    } else if (c >= 0xd800 && c <= 0xdfff) {
      out += "\ufffd"; // A lone surrogate, which UTF-8 cannot carry.
    } else {
      out += ch;
    }
  }
  return `${out}"`;
}
