// The dashboard's "notify me on this device": shows the sleeve's Web Push notifications, closes
// one the sidecar withdraws (its `tag`), and answers Allow or Deny with the notification's one-tap
// link, so that a permission request is answered from the lock screen in one tap.
'use strict';

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('push', (event) => {
  let msg = {};
  try { msg = event.data ? event.data.json() : {}; } catch { msg = {}; }
  if (msg.type === 'close') {
    event.waitUntil(self.registration.getNotifications({ tag: msg.tag })
      .then((shown) => shown.forEach((n) => n.close())));
    return;
  }
  const links = msg.actions || null;
  event.waitUntil(self.registration.showNotification(msg.title || 'sleeve', {
    body: msg.body || '',
    tag: msg.tag,
    data: { url: msg.url || null, actions: links },
    requireInteraction: Boolean(links),
    actions: links ? [{ action: 'allow', title: 'Allow' }, { action: 'deny', title: 'Deny' }] : [],
  }));
});

async function answer(link, title) {
  let text;
  try {
    const response = await fetch(link, {
      method: 'POST', credentials: 'omit', cache: 'no-store', headers: { Accept: 'application/json' },
    });
    const body = await response.json().catch(() => ({}));
    if (response.ok) text = body.decision === 'allow' ? 'Allowed.' : 'Denied.';
    else if (response.status === 409) text = `Answered already: ${body.decision} (by ${body.by}).`;
    else text = 'This link no longer works.';
  } catch {
    text = 'The sleeve could not be reached.';
  }
  await self.registration.showNotification(title, { body: text, tag: 'answer' });
}

self.addEventListener('notificationclick', (event) => {
  const note = event.notification;
  const data = note.data || {};
  note.close();
  const link = data.actions && data.actions[event.action];
  if (link) event.waitUntil(answer(link, note.title));
  else if (data.url) event.waitUntil(self.clients.openWindow(data.url));
});
