//! The few XML shapes EC2 answers with, written by hand.
//!
//! Responses are small, flat and fixed in shape, so a writer with escaping is all that is
//! needed; an XML crate would add a dependency for no gain.

/// EC2's Query API namespace for the API version the emulator speaks.
pub(crate) const NAMESPACE: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

/// An XML document built element by element.
pub(crate) struct Xml {
    out: String,
}

impl Xml {
    /// A response document `<{action}Response xmlns=...>` with its `requestId`.
    pub(crate) fn response(action: &str, request_id: &str) -> Xml {
        let mut x = Xml { out: String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n") };
        x.out.push_str(&format!("<{action}Response xmlns=\"{NAMESPACE}\">"));
        x.leaf("requestId", request_id);
        x
    }

    pub(crate) fn open(&mut self, tag: &str) -> &mut Self {
        self.out.push('<');
        self.out.push_str(tag);
        self.out.push('>');
        self
    }

    pub(crate) fn close(&mut self, tag: &str) -> &mut Self {
        self.out.push_str("</");
        self.out.push_str(tag);
        self.out.push('>');
        self
    }

    pub(crate) fn leaf(&mut self, tag: &str, text: &str) -> &mut Self {
        if text.is_empty() {
            return self.empty(tag);
        }
        self.open(tag);
        escape_into(&mut self.out, text);
        self.close(tag)
    }

    pub(crate) fn empty(&mut self, tag: &str) -> &mut Self {
        self.out.push('<');
        self.out.push_str(tag);
        self.out.push_str("/>");
        self
    }

    /// Close the response element opened by [`Xml::response`].
    pub(crate) fn finish(mut self, action: &str) -> String {
        self.close(&format!("{action}Response"));
        self.out
    }
}

/// EC2's error document: `<Response><Errors><Error>..</Error></Errors><RequestID>`.
pub(crate) fn error_document(code: &str, message: &str, request_id: &str) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str("<Response><Errors><Error><Code>");
    escape_into(&mut out, code);
    out.push_str("</Code><Message>");
    escape_into(&mut out, message);
    out.push_str("</Message></Error></Errors><RequestID>");
    escape_into(&mut out, request_id);
    out.push_str("</RequestID></Response>");
    out
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_nests() {
        let mut x = Xml::response("DescribeRegions", "r-1");
        x.open("regionInfo").leaf("k", "a<b & 'c'").leaf("e", "").close("regionInfo");
        let doc = x.finish("DescribeRegions");
        assert!(doc.ends_with(
            "<requestId>r-1</requestId><regionInfo><k>a&lt;b &amp; &apos;c&apos;</k><e/>\
             </regionInfo></DescribeRegionsResponse>"
        ));
        assert_eq!(
            error_document("X", "m\"", "id"),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>X\
             </Code><Message>m&quot;</Message></Error></Errors><RequestID>id</RequestID>\
             </Response>"
        );
    }
}
