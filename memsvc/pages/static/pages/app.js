// The pages' script: questions before deleting much, and the conversation page's chat. No
// inline script: the page's Content-Security-Policy allows only files of this site.
"use strict";

// Logging out leaves no copy of a page in this tab: htmx keeps the pages it swapped in
// (its history) in the tab's storage, someone's conversations among them (review).
document.addEventListener("submit", (event) => {
  if (event.target.matches("form[data-logout]")) sessionStorage.removeItem("htmx-history-cache");
});

// A form that deletes much at once, or what its sender cannot undo alone (a member removed,
// leaving), asks first (``data-confirm``: the question). Registered
// for the capture phase, so it runs before any other handler (the chat's, htmx's) sees the
// submit. Without this script the form deletes at once.
document.addEventListener(
  "submit",
  (event) => {
    const question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  },
  true,
);

// How long the chat waits for a message to be kept, and for an answer whole (the model's
// own limit, ``memsvc.llm.TIMEOUT_SECONDS``, and some).
const SENDING_SECONDS = 30;
const ANSWERING_SECONDS = 150;

// The chat: the person's message is sent, shown, and the assistant's answer (if the
// conversation has one) is streamed into the page as the model writes it. Without this
// script the same form posts normally and the page comes back with the answer. (Without an
// assistant too: posted normally, a message sent once the session had ended was lost at the
// login page; review.)
document.addEventListener("submit", async (event) => {
  const form = event.target;
  const list = document.getElementById("messages");
  if (!form.matches("form#append") || !list) return;
  event.preventDefault();
  if (form.dataset.sending) return; // (one at a time: the button stays focusable meanwhile)
  // A conversation opened at an earlier message (a search hit, a page back): the new turn
  // belongs after pages not shown, so once it is kept the page opens on the latest messages,
  // where the answer is asked for. (It was posted without the script, and lost at the login
  // page when the session had ended; a page back put it after its last row: review.)
  const elsewhere = list.querySelector(".more.later") !== null;
  await whileSending(form, async () => {
    const sent = await fetch(form.action, {
      method: "POST",
      body: new FormData(form),
      headers: { "HX-Request": "true" },
      signal: AbortSignal.timeout(SENDING_SECONDS * 1000),
    });
    if (loggedOut(sent, form)) return;
    const row = await sent.text(); // rendered (and escaped) by the server
    if (!sent.ok) {
      form.insertAdjacentHTML("afterbegin", row);
      // Said on the box too, as every form's refusal is (the ``invalid`` tag): it was
      // only inserted above it (review).
      const refusal = form.querySelector(".error");
      refusal.id = "append-refusal";
      form.elements.content.setAttribute("aria-invalid", "true");
      form.elements.content.setAttribute("aria-describedby", refusal.id);
      return;
    }
    if (elsewhere) {
      if (form.dataset.replyUrl) sessionStorage.setItem(answerKey(form), "asked");
      form.reset();
      window.location.assign(location.pathname);
      return;
    }
    list.querySelector(".empty")?.remove();
    list.insertAdjacentHTML("beforeend", row);
    form.reset();
    if (form.dataset.replyUrl) return answer(form, list);
  });
});

// An answer refused as too many at once, after the message was kept (the assistant was free
// when it was sent), or that the model failed to write: the person asks for it again,
// without sending the message twice.
document.addEventListener("click", async (event) => {
  const again = event.target.closest("form#append button.ask-again");
  if (!again) return;
  const form = again.form;
  if (form.dataset.sending) return;
  await whileSending(form, () => answer(form, document.getElementById("messages")));
});

// The session ended meanwhile (logged out in another tab, expired): the server names the
// login page (``HX-Redirect``, as htmx reads it), and the browser goes there whole; the
// login page is not put into the list as a message. A message ``form`` did not send is
// kept for this page and this person, whom the login brings back here (it was lost:
// review); another person logging in in this tab does not get it (code review).
function loggedOut(response, form) {
  const login = response.headers.get("HX-Redirect");
  if (login) {
    if (form) sessionStorage.setItem(unsentKey(form), form.elements.content.value);
    window.location.assign(login);
  }
  return Boolean(login);
}

function unsentKey(form) {
  return `memsvc-unsent:${form.dataset.user}:${location.pathname}`;
}

// A message sent from an earlier page, whose answer the latest page asks for.
function answerKey(form) {
  return `memsvc-answer:${form.dataset.user}:${location.pathname}`;
}

// A message kept when the session ended as it was sent, back in its box. The page's offer
// to ask for an answer again is the script's to keep (hidden without it, a button that did
// nothing: review).
const chat = document.querySelector("form#append");
if (chat) {
  chat.querySelectorAll(".ask-again[hidden]").forEach((again) => again.removeAttribute("hidden"));
  const unsent = sessionStorage.getItem(unsentKey(chat));
  sessionStorage.removeItem(unsentKey(chat));
  if (unsent !== null && !chat.elements.content.value) chat.elements.content.value = unsent;
  const asked = sessionStorage.getItem(answerKey(chat)) !== null;
  sessionStorage.removeItem(answerKey(chat));
  const list = document.getElementById("messages");
  if (asked && list && chat.dataset.replyUrl) whileSending(chat, () => answer(chat, list));
}

// The form's send button is off while it sends or an answer comes (``aria-disabled``, not
// ``disabled``: a disabled button lost the focus to the page for as long as the answer took,
// and a screen reader said the person had left the form; review); what refused the previous
// send says nothing about this one.
async function whileSending(form, work) {
  const button = form.querySelector("button[type=submit]");
  // (The focus on a notice about to go goes to the Send button: it fell to the page for as
  // long as the answer took; review.)
  if (document.activeElement?.matches("form#append .ask-again")) button.focus();
  form.querySelectorAll(".error, .ask-again").forEach((notice) => notice.remove());
  form.elements.content.removeAttribute("aria-invalid");
  form.elements.content.removeAttribute("aria-describedby");
  form.dataset.sending = "true";
  button.setAttribute("aria-disabled", "true");
  let spoken = "";
  try {
    spoken = (await work()) || "";
  } catch (error) {
    // No answer in time (a server that hangs: the button stayed off for good; review), or
    // none at all (the network): said; the answer, if that is what did not come, may be
    // asked for again (a message not sent is still in its box).
    const answering = document.querySelectorAll("#messages .message.streaming");
    answering.forEach((row) => row.remove());
    const why = document.createElement("p");
    why.className = "error";
    why.setAttribute("role", "alert");
    why.textContent =
      error.name === "TimeoutError"
        ? "The server did not answer in time. Try again."
        : "The server could not be reached. Try again.";
    form.prepend(why);
    if (answering.length) offerToAskAgain(form);
  } finally {
    delete form.dataset.sending;
    button.removeAttribute("aria-disabled");
    // Back to the message box for the next one (from the button, or the page if a refusal
    // took the focus), and then the answer said: after the focus moved, not cut off by it.
    if ([document.body, button].includes(document.activeElement)) form.elements.content.focus();
    said(form, spoken);
  }
}

// What a screen reader hears of an answer: that it is being written, then the answer once
// whole (the row itself, a live region, was read again from its start at every piece, with
// the typing cursor: review). The page has the region from the start (one made as it is
// filled is seldom read).
function said(form, text) {
  let status = form.querySelector(".chat-status");
  if (!status) {
    status = document.createElement("p");
    status.className = "chat-status visually-hidden";
    status.setAttribute("role", "status");
    form.append(status);
  }
  status.textContent = text;
}

// What ends a streamed answer the model failed to write (the server's ANSWER_FAILED).
const ANSWER_FAILED = "\u001e";

// The assistant's answer to the latest turns, streamed into a new row of ``list``; what a
// screen reader is to say of it once whole (nothing when it failed: the refusal says why).
async function answer(form, list) {
  const row = document.createElement("li");
  row.className = "message assistant streaming";
  row.setAttribute("aria-busy", "true");
  const who = document.createElement("p");
  who.className = "who";
  who.innerHTML = '<strong></strong> <span class="meta">assistant</span>';
  who.firstChild.textContent = form.dataset.assistant;
  said(form, `${form.dataset.assistant} is writing an answer…`);
  const content = document.createElement("div");
  content.className = "content";
  content.dir = "auto"; // (as the rows the server writes)
  row.append(who, content);
  list.append(row);

  const token = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const reply = await fetch(form.dataset.replyUrl, {
    method: "POST",
    headers: { "X-CSRFToken": token, "HX-Request": "true" },
    signal: AbortSignal.timeout(ANSWERING_SECONDS * 1000),
  });
  if (loggedOut(reply)) return;
  if (!reply.ok) {
    // Refused (the assistant removed meanwhile, too many answers at once): why, as for a
    // message; too many at once (the pages' own limit, or the server's on answers and
    // downloads sent at once, whose refusal is plain text) may be asked again.
    row.remove();
    if (reply.headers.get("Content-Type")?.startsWith("text/html")) {
      form.insertAdjacentHTML("afterbegin", await reply.text());
    } else {
      const why = document.createElement("p");
      why.className = "error";
      why.setAttribute("role", "alert");
      why.textContent = await reply.text();
      form.prepend(why);
    }
    if (reply.status === 429 || reply.status === 503) offerToAskAgain(form);
    return;
  }
  const reader = reply.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    content.append(decoder.decode(value, { stream: true })); // (a text node more, each piece)
  }
  // The model failed (the server's ANSWER_FAILED, then why): nothing was kept, what was
  // written of it goes; why is said as a refusal, and the answer may be asked for again.
  const failed = content.textContent.indexOf(ANSWER_FAILED);
  if (failed >= 0) {
    row.remove();
    const why = document.createElement("p");
    why.className = "error";
    why.setAttribute("role", "alert");
    why.textContent = content.textContent.slice(failed + 1);
    form.prepend(why);
    offerToAskAgain(form);
    return "";
  }
  row.classList.remove("streaming");
  row.removeAttribute("aria-busy");
  return `${form.dataset.assistant}: ${content.textContent}`;
}

// A button after the refusal of an answer (``.error``) that asks for the answer alone.
function offerToAskAgain(form) {
  const again = document.createElement("button");
  again.type = "button";
  again.className = "link ask-again";
  again.textContent = "Ask for the answer again";
  form.querySelector(".error").after(again);
}

// What htmx swaps in where the focus was (a "More ..." link, a memory's Delete button) takes
// the focus: its first link or button, else the new element itself (a "Deleted." notice).
// Otherwise the focus falls back to the page, and a keyboard user starts again from the top.
let focusedSwap = null;
document.addEventListener("htmx:beforeSwap", (event) => {
  const target = event.detail.target;
  focusedSwap =
    target && target.contains(document.activeElement)
      ? { parent: target.parentElement, before: target.previousElementSibling }
      : null;
});
document.addEventListener("htmx:afterSettle", () => {
  if (!focusedSwap || document.activeElement !== document.body) return;
  const { parent, before } = focusedSwap;
  focusedSwap = null;
  const arrived = before ? before.nextElementSibling : parent?.firstElementChild;
  if (!arrived) return;
  const control = arrived.matches("a[href], button")
    ? arrived
    : [...arrived.querySelectorAll("a[href], summary, button:not([disabled])")].find((c) =>
        c.checkVisibility ? c.checkVisibility() : c.getClientRects().length > 0,
      ); // (not a button in a closed "Fork from here": the focus fell to the page; review)
  if (control) {
    control.focus();
  } else {
    arrived.tabIndex = -1;
    arrived.focus();
  }
});

// A list that shows each thing once (``data-one-row-each``; its rows name it in ``data-row``):
// a page that htmx adds to it may hold a thing shown already, with what changed since (the
// conversations with activity since the walk of the list began, ``activity_page``). The row
// just added is the newer: the one shown before goes. (Registered after the focus's handler,
// which finds the new rows beside those shown before.)
document.addEventListener("htmx:afterSettle", (event) => {
  const row = event.target;
  const list = row.parentElement;
  if (!row.dataset?.row || !list?.matches("[data-one-row-each]")) return;
  for (const shown of list.querySelectorAll(`[data-row="${CSS.escape(row.dataset.row)}"]`)) {
    if (shown !== row) shown.remove();
  }
});

// A conversation opened at a message (a search hit, ``?at=``): the focus on it, so that a
// screen reader starts there and a keyboard goes on from it (only a ring marked it; review).
// (Not when a refused form's field asks for it, nor a notice of what a form did: code review.)
if (!document.querySelector("[aria-invalid=true], .done")) {
  document.querySelector("#messages .message.target")?.focus();
}
